"""The worker and producer side of ``bench_burst.py``: one module for every system compared.

``BURST_SYSTEM`` picks the system this process runs: ``celery`` or ``dramatiq`` (delayq's
Celery transport and Dramatiq broker), ``pgqueuer`` or ``procrastinate`` (the peers, through
their own APIs). Every system runs the same two jobs, and each reports to Redis with one round
trip, whatever the system:

- ``burst(ident)``: pushes ``"ident start eta"`` to ``BURST_KEY:runs``, ``start`` being
  ``time.time()`` when the job starts and ``eta`` the due time the message itself carries
  (Celery's ``request.eta``, Dramatiq's ``options["eta"]``, PgQueuer's ``execute_after``,
  Procrastinate's ``scheduled_at``), never the producer's clock after the fact;
- ``noop(key, total)``: counts into ``key``; the run that reaches ``total`` stamps
  ``key:done``.

The environment (``bench_burst.py`` sets it per phase): ``BURST_URL`` (the system's database),
``BURST_QUEUE``, ``BURST_COUNTER`` (Redis URL), ``BURST_KEY``; for Celery
the variables ``celery_bench_app`` reads (``BENCH_*``); for the peers ``BURST_PEER_OPTION``
(``limit4``: PgQueuer's entrypoints get ``concurrency_limit=4``) and ``BURST_PEER_DRIVER``
(``asyncpg``: PgQueuer's worker on asyncpg, when it is installed, instead of psycopg).

Producers are ``python -c 'import burst_app; burst_app.produce(...)'`` processes: they connect,
say so in Redis and wait for the harness' go (one BLPOP, so they start within a millisecond of
one another), then publish their share of the plan (see :func:`plan`).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

SYSTEM = os.environ.get("BURST_SYSTEM", "")
KEY = os.environ.get("BURST_KEY", "burst")
QUEUE = os.environ.get("BURST_QUEUE", "burst")
URL = os.environ.get("BURST_URL", "")
#: Printed by a peer's worker process once it runs (Celery and Dramatiq log their own).
READY_LINE = "burst: worker ready"
_counter = redis.Redis.from_url(os.environ.get("BURST_COUNTER", "redis://127.0.0.1:6379/12"))


def record(ident: int, eta: float | None) -> None:
    """One run of a countdown: who, when it started, when it was due (NaN if unknown)."""
    start = time.time()
    _counter.rpush(f"{KEY}:runs", f"{ident} {start!r} {eta if eta is not None else 'nan'}")


def count(key: str, total: int) -> None:
    """One no-op run; the run that reaches the total stamps the finish time."""
    if _counter.incr(key) >= total:
        _counter.set(f"{key}:done", repr(time.time()), nx=True)


def plan(n: int, span_s: float, seed: int, spacing_s: float, index: int, producers: int
         ) -> list[tuple[int, float, float]]:
    """``(ident, offset_s, delay_s)`` of this producer's share: ident ``i`` belongs to producer
    ``i % producers``; delays uniform over ``[0, span_s)`` from one seeded draw (every producer
    draws the same sequence); offsets ``i * spacing_s`` (0: as fast as possible)."""
    rng = random.Random(seed)
    delays = [rng.uniform(0.0, span_s) for _ in range(n)]
    return [(i, i * spacing_s, delays[i]) for i in range(index, n, producers)]


def _pace(start: float, offset: float) -> None:
    pause = start + offset - time.monotonic()
    if pause > 0:
        time.sleep(pause)


def _stamp_sends(key: str, first: float) -> None:
    """The producers' first and last send times (the earliest first; every one's last)."""
    pipe = _counter.pipeline(transaction=False)
    pipe.setnx(f"{key}:sent0", repr(first))
    pipe.rpush(f"{key}:sent_end", repr(time.time()))
    pipe.execute()


def _barrier(key: str) -> float:
    """Connected: say so, wait for the harness' go; returns the first send's time."""
    _counter.incr(f"{key}:ready")
    if _counter.blpop([f"{key}:go"], timeout=300) is None:
        sys.exit("burst producer: no go from the harness within 300 s")
    return time.time()


def _send(work: Work, noop: Callable[[], Any], burst: Callable[[int, float], Any]) -> None:
    """Send ``work`` one message per call: ``noop()`` per no-op, ``burst(ident, delay_s)`` per
    countdown at its offset from the start."""
    if isinstance(work, tuple):
        for _ in range(work[1]):
            noop()
        return
    t0 = time.monotonic()
    for ident, offset, delay in work:
        _pace(t0, offset)
        burst(ident, delay)


async def _send_async(work: Work, noop: Callable[[], Awaitable[Any]],
                      burst: Callable[[int, float], Awaitable[Any]]) -> None:
    """:func:`_send` through an async API (the pauses of a spaced plan awaited)."""
    if isinstance(work, tuple):
        for _ in range(work[1]):
            await noop()
        return
    t0 = time.monotonic()
    for ident, offset, delay in work:
        pause = t0 + offset - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        await burst(ident, delay)


#: What one producer sends: a no-op count ``(key, share, total)``, or its share of the plan.
Noops = tuple[str, int, int]
Work = Noops | list[tuple[int, float, float]]


if SYSTEM == "dramatiq":  # celery_bench_app checks the same for Celery
    import delayq_transport

    #: A variant (bench/_variants.py) must run that tree's delayq, not this checkout's.
    _ROOT = os.environ.get("BENCH_DELAYQ_ROOT")
    _WHERE = os.path.dirname(os.path.dirname(os.path.realpath(delayq_transport.__file__)))
    if _ROOT is not None and _WHERE != os.path.realpath(_ROOT):
        raise RuntimeError(f"BENCH_DELAYQ_ROOT is {_ROOT}, but delayq comes from {_WHERE}")


# -- Celery (delayq's transport) ------------------------------------------------------------

if SYSTEM == "celery":
    from celery_bench_app import app, configure

    configure()
    app.conf.task_default_queue = QUEUE

    @app.task(name="burst.burst", bind=True, ignore_result=True)
    def burst(self: Any, ident: int) -> None:
        eta = self.request.eta
        record(ident, datetime.fromisoformat(eta).timestamp() if eta else None)

    if os.environ.get("BURST_TRACE"):
        import gc

        from celery.signals import task_received

        _gc_start = [0.0]

        def _gc_timer(phase: str, info: dict[str, Any]) -> None:
            """Diagnostics: collections that take over 5 ms, by process and generation."""
            if phase == "start":
                _gc_start[0] = time.perf_counter()
                return
            took = (time.perf_counter() - _gc_start[0]) * 1000
            if took > 5:
                _counter.rpush(f"{KEY}:gc", f"{os.getpid()} {info['generation']} "
                                            f"{time.time()!r} {took:.1f}")

        gc.callbacks.append(_gc_timer)

        @task_received.connect
        def _received(request: Any, **_: Any) -> None:
            """Diagnostics: when the worker's main process got the countdown (before the
            pool); beside ``start`` it splits lateness into the queue's part and the pool's."""
            if request.name == "burst.burst":
                _counter.rpush(f"{KEY}:recv", f"{request.args[0]} {time.time()!r}")

    @app.task(name="burst.noop", ignore_result=True)
    def noop(key: str, total: int) -> None:
        count(key, total)

    def _produce_celery(work: Work, key: str) -> None:
        with app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=5)
            first = _barrier(key)
            _send(work,
                  lambda: noop.apply_async((work[0], work[2]), producer=producer),
                  lambda ident, delay: burst.apply_async(
                      (ident,), eta=datetime.fromtimestamp(time.time() + delay, UTC),
                      producer=producer))
        _stamp_sends(key, first)

# -- Dramatiq (delayq's broker) -------------------------------------------------------------

if SYSTEM == "dramatiq":
    import dramatiq
    from dramatiq.middleware import CurrentMessage

    from delayq_transport.dramatiq import DelayqBroker

    broker = DelayqBroker(url=URL)
    broker.add_middleware(CurrentMessage())
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="burst")
    def burst_actor(ident: int) -> None:
        """The eta is read from the message as it was sent (the row's payload): the consumer
        hands the actor the due message without it, as Dramatiq's own delay queues do."""
        message = CurrentMessage.get_current_message()
        envelope = getattr(message, "envelope", None)
        sent = dramatiq.Message.decode(envelope.payload) if envelope is not None else message
        eta = sent.options.get("eta") if sent is not None else None
        record(ident, eta / 1000 if eta is not None else None)

    @dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="noop")
    def noop_actor(key: str, total: int) -> None:
        count(key, total)

    def _produce_dramatiq(work: Work, key: str) -> None:
        first = _barrier(key)
        _send(work, lambda: noop_actor.send(work[0], work[2]),
              lambda ident, delay: burst_actor.send_with_options(args=(ident,),
                                                                 delay=int(delay * 1000)))
        _stamp_sends(key, first)
        broker.close()


# -- PgQueuer ------------------------------------------------------------------------------

#: ``limit4``: the entrypoints get ``concurrency_limit=4`` (PgQueuer's default: no limit).
LIMIT = 4 if os.environ.get("BURST_PEER_OPTION") == "limit4" else 0


def _pgqueuer_manager(driver: Any) -> Any:
    """A QueueManager with the two entrypoints, at PgQueuer's defaults (but ``LIMIT``)."""
    import redis.asyncio as aioredis
    from pgqueuer import Queries, QueueManager

    counter = aioredis.Redis.from_url(os.environ.get("BURST_COUNTER", ""))
    qm = QueueManager(Queries(driver))

    @qm.entrypoint("burst", concurrency_limit=LIMIT)
    async def burst_job(job: Any) -> None:
        start = time.time()
        await counter.rpush(f"{KEY}:runs",
                            f"{int(job.payload)} {start!r} {job.execute_after.timestamp()!r}")

    @qm.entrypoint("noop", concurrency_limit=LIMIT)
    async def noop_job(job: Any) -> None:
        key, total = job.payload.decode().split()
        if await counter.incr(key) >= int(total):
            await counter.set(f"{key}:done", repr(time.time()), nx=True)

    return qm


@asynccontextmanager
async def _pgqueuer_factory() -> AsyncIterator[Any]:
    """The factory ``pgqueuer.run`` takes (``pgq run``'s ``module:factory``)."""
    import psycopg
    from pgqueuer import PsycopgDriver

    if os.environ.get("BURST_PEER_DRIVER") == "asyncpg":  # not installed by the bench extra
        import asyncpg
        from pgqueuer import AsyncpgDriver

        relaxed = {"synchronous_commit": "off"} if "synchronous_commit" in URL else None
        aconn = await asyncpg.connect(URL.split("?")[0], server_settings=relaxed)
        try:
            qm = _pgqueuer_manager(AsyncpgDriver(aconn))
            print(READY_LINE, flush=True)
            yield qm
        finally:
            await aconn.close()
        return
    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        qm = _pgqueuer_manager(PsycopgDriver(conn))
        print(READY_LINE, flush=True)
        yield qm


def run_pgqueuer() -> None:
    """One PgQueuer worker through ``pgqueuer.run`` (what ``pgq run`` does), its defaults."""
    import pgqueuer

    asyncio.run(pgqueuer.run(_pgqueuer_factory))


async def _install_pgqueuer() -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        await Queries(PsycopgDriver(conn)).install()


def _produce_pgqueuer(work: Work, key: str, api: str) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    payload = f"{work[0]} {work[2]}".encode() if isinstance(work, tuple) else b""
    if api == "sync":
        with psycopg.connect(URL, autocommit=True) as conn:
            queries = SyncQueries(SyncPsycopgDriver(conn))
            first = _barrier(key)
            _send(work, lambda: queries.enqueue("noop", payload),
                  lambda ident, delay: queries.enqueue(
                      "burst", str(ident).encode(), execute_after=timedelta(seconds=delay)))
        _stamp_sends(key, first)
        return

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
            queries = Queries(PsycopgDriver(conn))
            first = _barrier(key)  # blocking: nothing else runs on this loop yet
            await _send_async(work, lambda: queries.enqueue("noop", payload),
                              lambda ident, delay: queries.enqueue(
                                  "burst", str(ident).encode(),
                                  execute_after=timedelta(seconds=delay)))
        _stamp_sends(key, first)

    asyncio.run(main())


# -- Procrastinate -------------------------------------------------------------------------

if SYSTEM == "procrastinate":
    import procrastinate
    import redis.asyncio as aioredis

    papp = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))
    _acounter = aioredis.Redis.from_url(os.environ.get("BURST_COUNTER", ""))

    @papp.task(name="burst", queue=QUEUE, pass_context=True)
    async def burst_task(context: Any, ident: int) -> None:
        start = time.time()
        at = context.job.scheduled_at
        await _acounter.rpush(f"{KEY}:runs", f"{ident} {start!r} "
                              f"{at.timestamp() if at is not None else 'nan'}")

    @papp.task(name="noop", queue=QUEUE)
    async def noop_task(key: str, total: int) -> None:
        if await _acounter.incr(key) >= total:
            await _acounter.set(f"{key}:done", repr(time.time()), nx=True)


def run_procrastinate(concurrency: int) -> None:
    """One Procrastinate worker at its defaults but ``concurrency``."""

    async def main() -> None:
        async with papp.open_async():
            print(READY_LINE, flush=True)
            await papp.run_worker_async(queues=[QUEUE], concurrency=concurrency)

    asyncio.run(main())


def _install_procrastinate() -> None:
    with papp.open():
        papp.schema_manager.apply_schema()


def _eta_of(delay: float) -> datetime:
    return datetime.fromtimestamp(time.time() + delay, UTC)


def _produce_procrastinate(work: Work, key: str, api: str) -> None:
    if api == "sync":
        with papp.open():
            first = _barrier(key)
            _send(work, lambda: noop_task.defer(key=work[0], total=work[2]),
                  lambda ident, delay: burst_task.configure(
                      schedule_at=_eta_of(delay)).defer(ident=ident))
        _stamp_sends(key, first)
        return

    async def main() -> None:
        async with papp.open_async():
            first = _barrier(key)
            await _send_async(work, lambda: noop_task.defer_async(key=work[0], total=work[2]),
                              lambda ident, delay: burst_task.configure(
                                  schedule_at=_eta_of(delay)).defer_async(ident=ident))
        _stamp_sends(key, first)

    asyncio.run(main())


# -- entry points of the processes bench_burst.py starts ------------------------------------


def install() -> None:
    """The peer's schema in the fresh database (delayq creates its own on first use)."""
    if SYSTEM == "pgqueuer":
        asyncio.run(_install_pgqueuer())
    elif SYSTEM == "procrastinate":
        _install_procrastinate()


def produce(key: str, what: str, n: int, index: int, producers: int, span_s: float = 0.0,
            seed: int = 0, spacing_s: float = 0.0, api: str = "sync") -> None:
    """One producer process: ``what`` is ``noop`` (its share of ``n`` no-ops counting into
    ``key``) or ``burst`` (its share of the plan); ``key`` also names the start barrier."""
    work: Work
    if os.environ.get("BURST_PRODUCER_NICE"):  # diagnostics: how much is the producers' CPU
        os.nice(int(os.environ["BURST_PRODUCER_NICE"]))
    if what == "noop":
        work = (key, n // producers + (index < n % producers), n)
    else:
        work = plan(n, span_s, seed, spacing_s, index, producers)
    if SYSTEM == "celery":
        _produce_celery(work, key)
    elif SYSTEM == "dramatiq":
        _produce_dramatiq(work, key)
    elif SYSTEM == "pgqueuer":
        _produce_pgqueuer(work, key, api)
    elif SYSTEM == "procrastinate":
        _produce_procrastinate(work, key, api)
    else:
        sys.exit(f"unknown BURST_SYSTEM {SYSTEM!r}")
