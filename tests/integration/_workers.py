"""Helpers shared by the integration tests: a settable clock, table snapshots, and the
producer/consumer/offerer functions run in subprocesses.

Each child builds its own pool and never touches a connection it inherited; multiprocessing
ends forked children with ``os._exit``, so inherited sockets are closed without a word to the
server. That makes ``fork`` safe here, and it spares every child the ~1 s of imports ``spawn``
costs on this 2-core box.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import psycopg

from delayq_transport import DelayedQueue, Offer, OfferOutcome

MP = mp.get_context("fork")
#: Upper bound for any wait in these tests; a wait that reaches it is a failure, not a skip.
WAIT_S = 20.0
#: Pool size per subprocess: several processes share the server's 100 connections with other
#: test sessions on this box.
CHILD_POOL = 2


class FakeClock:
    """An injectable clock the test moves by hand, so due-ness never depends on wall time."""

    def __init__(self, start: datetime | None = None) -> None:
        self.at = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.at

    def advance(self, delta: timedelta | float) -> datetime:
        with self._lock:
            self.at += delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
            return self.at


def snapshot(url: str, table: str = "delayed_queue") -> list[tuple[Any, ...]]:
    """Every row of the table, ordered: compared before/after a call that must change nothing."""
    with psycopg.connect(url) as conn:
        return conn.execute(f'SELECT * FROM "{table}" ORDER BY "id"').fetchall()


def wait_until(predicate: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "") -> Any:
    """Poll ``predicate`` until truthy; fail (AssertionError) at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(0.02)


# -- subprocess targets ---------------------------------------------------------------------


def offer_same_key(
    url: str, key: str, worker: int, rounds: int, barrier: Barrier, out: Any
) -> None:
    """Offer one key ``rounds`` times with payloads unique to this worker; report outcomes."""
    with DelayedQueue(url, kind="cas", ensure_schema=False, pool_max_size=1) as q:
        at = datetime(2031, 1, 1, tzinfo=UTC)
        barrier.wait()
        outcomes = []
        for i in range(rounds):
            payload = f"w{worker}-r{i}".encode()
            outcomes.append(q.offer(key, payload, at + timedelta(seconds=i)).value)
        out.put((worker, outcomes))


def produce(url: str, kind: str, worker: int, count: int, start: Barrier) -> None:
    """Offer ``count`` messages keyed ``p{worker}-{i}``: mostly batches, some one by one,
    some due a moment later than now so consumers also see rows become due."""
    with DelayedQueue(url, kind=kind, ensure_schema=False, pool_max_size=1) as q:
        start.wait()  # every producer and consumer is connected: they really overlap
        now = q.now()
        singles = 200
        for i in range(singles):
            q.offer(f"p{worker}-{i}", f"{worker}:{i}".encode())
        offers = [
            Offer(f"p{worker}-{i}", f"{worker}:{i}".encode(),
                  now + timedelta(milliseconds=(i % 7) * 150))
            for i in range(singles, count)
        ]
        for start_i in range(0, len(offers), 500):
            outcomes = q.offer_batch(offers[start_i : start_i + 500])
            assert all(o is OfferOutcome.CREATED for o in outcomes), outcomes


def consume(url: str, kind: str, start: Barrier, producers_done: Event, out: Any) -> None:
    """Poll, record and batch-ack until producers are done and nothing is left to take.

    Reports (keys delivered, acks that deleted a row, redeliveries seen) through ``out``.
    """
    keys: list[str] = []
    acked = redelivered = 0
    deadline = time.monotonic() + 60
    with DelayedQueue(url, kind=kind, ensure_schema=False, pool_max_size=1) as q:
        start.wait()
        while time.monotonic() < deadline:
            batch = q.try_poll_many(100)
            if batch:
                keys += [e.key for e in batch]
                redelivered += sum(e.is_redelivery for e in batch)
                acked += q.ack_many(batch)
            elif producers_done.is_set() and q.count_waiting() == 0:
                break
            else:
                time.sleep(0.01)
    out.put((os.getpid(), keys, acked, redelivered))


def hold_and_hang(url: str, kind: str, lease_s: float, out: Any) -> None:
    """Acquire every due message, report what and when (database clock), then never ack."""
    with DelayedQueue(url, kind=kind, acquire_timeout=lease_s, ensure_schema=False,
                      pool_max_size=1) as q:
        before_ms = int(q.now().timestamp() * 1000)
        held = q.try_poll_many(1000)
        out.put((before_ms, sorted(e.key for e in held)))
        threading.Event().wait()  # until SIGKILL


def run_migrate(url: str, table: str, barrier: Barrier, out: Any) -> None:
    """Migrate a table right as every sibling process does; report an error's text or None."""
    from delayq_transport import Database, migrate

    try:
        with Database(url, max_size=1) as db:
            barrier.wait()
            migrate(db, table)
        out.put(None)
    except Exception as exc:  # reported to the parent, which fails the test with the text
        out.put(f"{type(exc).__name__}: {exc}")
