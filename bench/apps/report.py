"""What every framework's task app shares: the report a task makes, and the producer loop.

Every system runs the same three tasks, and each reports to a Redis database with one round
trip, whatever the system, so a report costs every system the same:

- ``noop(key, total)``: counts into ``key`` and stamps the first run (``key:first``) in the
  same round trip; the run that reaches ``total`` stamps ``key:done``;
- ``timed(key, ident, due)``: pushes ``"ident start due"`` to ``key:runs``: ``start`` is
  ``time.time()`` when the task starts, ``due`` the time the producer asked it to run at (the
  send time of an immediate task, send time + delay of a deferred one);
- ``sleepy(key, ident, seconds)``: pushes ``"ident start pid"`` to ``key:starts``, sleeps,
  then pushes ``"ident end"`` to ``key:ends`` (the killed-worker scenario).

A producer (:func:`produce`) builds its share of a job's plan, says it is connected, waits for
the harness' go (one BLPOP, so producers start within a millisecond of one another), sends,
and stamps its first and last send. The apps give it one thing: a sender per thread,
``send(task_name, args, delay_s)``. Systems whose broker lives in the worker's memory run the
producer as a thread of the worker process instead (:func:`serve_in_process`).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis

_local: dict[int, redis.Redis] = {}
_made = threading.Lock()


def client() -> redis.Redis:
    """This process' client (one per pid: a forked pool child makes its own), made once
    under a lock: a second client made by a racing thread and dropped would close its
    connections under the pipeline that uses them."""
    pid = os.getpid()
    with _made:
        if pid not in _local:
            _local[pid] = redis.Redis.from_url(os.environ.get("BENCH_REDIS",
                                                              "redis://127.0.0.1:6379/13"))
        return _local[pid]


def count(key: str, total: int) -> None:
    pipe = client().pipeline(transaction=False)
    pipe.incr(key)
    pipe.set(f"{key}:first", repr(time.time()), nx=True)
    if pipe.execute()[0] >= total:
        client().set(f"{key}:done", repr(time.time()), nx=True)


def timed(key: str, ident: int, due: float) -> None:
    client().rpush(f"{key}:runs", f"{ident} {time.time()!r} {due!r}")


def sleepy(key: str, ident: int, seconds: float) -> None:
    client().rpush(f"{key}:starts", f"{ident} {time.time()!r} {os.getpid()}")
    time.sleep(seconds)
    client().rpush(f"{key}:ends", f"{ident} {time.time()!r}")


_aclient: dict[int, Any] = {}


def _async_client() -> Any:
    import redis.asyncio as aioredis

    pid = os.getpid()
    if pid not in _aclient:
        _aclient[pid] = aioredis.Redis.from_url(os.environ.get("BENCH_REDIS",
                                                               "redis://127.0.0.1:6379/13"))
    return _aclient[pid]


async def acount(key: str, total: int) -> None:
    """:func:`count` for the async workers (PgQueuer, Procrastinate): their event loop is not
    held by the report's round trip."""
    pipe = _async_client().pipeline(transaction=False)
    pipe.incr(key)
    pipe.set(f"{key}:first", repr(time.time()), nx=True)
    if (await pipe.execute())[0] >= total:
        await _async_client().set(f"{key}:done", repr(time.time()), nx=True)


async def atimed(key: str, ident: int, due: float) -> None:
    await _async_client().rpush(f"{key}:runs", f"{ident} {time.time()!r} {due!r}")


async def asleepy(key: str, ident: int, seconds: float) -> None:
    import asyncio

    rc = _async_client()
    await rc.rpush(f"{key}:starts", f"{ident} {time.time()!r} {os.getpid()}")
    await asyncio.sleep(seconds)
    await rc.rpush(f"{key}:ends", f"{ident} {time.time()!r}")


# -- producers --------------------------------------------------------------------------


class Sender(Protocol):
    def send(self, name: str, args: tuple[Any, ...], delay_s: float) -> None: ...

    def close(self) -> None: ...


#: One send of a plan: (offset from the start in s, task name, args before ``due``, delay s).
Item = tuple[float, str, tuple[Any, ...], float]


def plan(job: dict[str, Any]) -> list[Item]:
    """This producer's share of a job (``index`` of ``producers``). ``what``:

    - ``noop``: ``n`` no-ops counting into ``key`` (delay ``delay_s``, default none);
    - ``timed``: ``n`` timed tasks, delays uniform over ``[low_s, high_s)`` from one seeded
      draw, sent every ``spacing_s`` (0: as fast as possible);
    - ``sleepy``: ``n`` tasks sleeping ``seconds``.
    """
    key, n, index, producers = job["key"], job["n"], job["index"], job["producers"]
    mine = range(index, n, producers)
    if job["what"] == "noop":
        return [(0.0, "noop", (key, n), job.get("delay_s", 0.0)) for _ in mine]
    if job["what"] == "sleepy":
        return [(0.0, "sleepy", (key, i, job["seconds"]), 0.0) for i in mine]
    rng = random.Random(job.get("seed", 41))
    delays = [rng.uniform(job.get("low_s", 0.0), job.get("high_s", 0.0)) for _ in range(n)]
    spacing = job.get("spacing_s", 0.0)
    return [(i * spacing, "timed", (key, i), delays[i]) for i in mine]


def _send_all(sender: Sender, items: list[Item]) -> None:
    start = time.monotonic()
    for offset, name, args, delay in items:
        pause = start + offset - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if name == "timed":
            args = (*args, time.time() + delay)
        sender.send(name, args, delay)


def produce(make_sender: Callable[[], Sender], job: dict[str, Any]) -> None:
    """One producer: its share of ``job``, from ``job["threads"]`` threads (each its own
    sender), started on the harness' go (``sync``: the barrier's key, default ``key``); stamps
    ``key:sent0`` (the first producer's start) and ``key:sent_end`` (each one's end), and the
    CPU seconds it used sending (``key:cpu``)."""
    items, key, sync = plan(job), job["key"], job.get("sync", job["key"])
    threads = max(1, int(job.get("threads", 1)))
    senders = [make_sender() for _ in range(threads)]
    rc = client()
    rc.incr(f"{sync}:ready")
    if rc.blpop([f"{sync}:go"], timeout=600) is None:
        sys.exit("producer: no go from the harness within 600 s")
    first, cpu0 = time.time(), time.process_time()
    rc.setnx(f"{key}:sent0", repr(first))
    errors: list[BaseException] = []

    def run(sender: Sender, share: list[Item]) -> None:
        try:
            _send_all(sender, share)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(exc)

    pool = [threading.Thread(target=run, args=(s, items[i::threads]))
            for i, s in enumerate(senders)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for sender in senders:
        sender.close()
    if errors:
        raise errors[0]
    pipe = rc.pipeline(transaction=False)
    pipe.rpush(f"{key}:sent_end", repr(time.time()))
    pipe.rpush(f"{key}:cpu", repr(time.process_time() - cpu0))
    pipe.execute()


def main(make_sender: Callable[[], Sender]) -> None:
    """A producer process: ``python -c 'import <app>; <app>.produce_main()' JOB_JSON``."""
    produce(make_sender, json.loads(sys.argv[1]))


def serve_in_process(make_sender: Callable[[], Sender]) -> None:
    """In-memory brokers: a thread of the worker process takes producer jobs from the Redis
    list ``BENCH_INPROC`` names and runs each in a thread of its own (a producer in another
    process could not reach a broker that lives in this one)."""
    jobs = os.environ.get("BENCH_INPROC")
    if not jobs:
        return

    def loop() -> None:
        rc = redis.Redis.from_url(os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/13"))
        while True:
            got = rc.blpop([jobs], timeout=5)
            if got is not None:
                job = json.loads(got[1])
                threading.Thread(target=produce, args=(make_sender, job), daemon=True).start()

    threading.Thread(target=loop, daemon=True, name="bench-inproc").start()


def _check_revision() -> None:
    """A run against another revision (``--rev``) must measure that revision's delayq: its
    processes check where they import it from (a measurement of the wrong code is worse than
    none)."""
    root = os.environ.get("BENCH_DELAYQ_ROOT")
    if not root:
        return
    import delayq_transport

    where = os.path.dirname(os.path.dirname(os.path.realpath(delayq_transport.__file__)))
    if where != os.path.realpath(root):
        raise RuntimeError(f"BENCH_DELAYQ_ROOT is {root}, but delayq comes from {where}")


_check_revision()
