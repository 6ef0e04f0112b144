"""The Celery harness of the Celery benchmarks (bench_celery, bench_scale) and profilers.

Every broker runs the same app (``celery_bench_app.py``) under the same real ``celery worker``
subprocess settings; only ``broker_url`` differs (plus each broker's redelivery option in the
kill phase). Here: the run's sizes (:class:`Settings`), workers in their own process groups
(killed with their pool children, also on Ctrl-C), a spawn pool of warmed producer processes
(publishing does not share the benchmark's GIL), fresh broker state per phase
(:func:`broker_state`: a new PostgreSQL database, a flushed Redis database or a new RabbitMQ
queue) and the Redis counters every task reports to with one round trip, whatever the broker.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import celery_bench_app
import psycopg
import redis
from _common import BENCH_DIR, REPO_ROOT, fresh_database, tree_rss, wait_for_log
from _variants import check_import, parse, safe_name, spawn_path, variant_env

BROKERS = ("delayq", "delayq_durable", "delayq_unlogged", "delayq_buffered", "delayq_pgbouncer",
           "delayq_pgbouncer_listen", "redis", "amqp", "amqp_confirm", "sqlalchemy")
#: ``delayq_durable`` is delayq with the ``durable_publish=True`` transport option: every
#: publish waits for the WAL flush, to show what that stricter durability costs.
#: ``delayq_unlogged`` sets ``unlogged_table=True`` (no WAL; a crash empties the table), to
#: show what the WAL costs. ``delayq_buffered`` sets ``publish_linger`` (publishes written in
#: batches every BUFFERED_LINGER_S; a publish returns before its row is written).
#: ``delayq_pgbouncer`` goes through a PgBouncer in transaction pooling started for the phase
#: (no named prepared statements, settings per transaction, no LISTEN: polls every 0.5 s);
#: ``delayq_pgbouncer_listen`` is the same with a direct ``listen_url`` for wake-ups.
#: ``amqp_confirm`` is RabbitMQ with publisher confirms (``confirm_publish=True``: a publish
#: returns once the broker has the message), the like-for-like peer of ``delayq_durable``.
BUFFERED_LINGER_S = 0.005
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
REDIS_BASE = "redis://127.0.0.1:6379"
MB = 1024 * 1024
#: Worker settings shared by every broker (stated in the docs section).
POOL, CONCURRENCY, PREFETCH = "prefork", 2, 4
WORKER_FLAGS = ("--loglevel=WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat")
#: The kill phase's redelivery settings: delayq's lease, and Redis' visibility timeout with the
#: restore sweep made to run every 10 s (by default it scans only every 10th call: ~100 s).
KILL_OPTIONS: dict[str, dict[str, Any]] = {
    "delayq": {"acquire_timeout": 10},
    "redis": {"visibility_timeout": 10, "unacked_restore_throttle": 1},
}
#: Tasks per producer job: a job is one ``apply_async`` loop in one producer process.
CHUNK = 500
#: A no-op run lasts ~10 s; on a shared 2-core machine one such window can be 30% off.
THROUGHPUT_ROUNDS = 3


@dataclass
class Settings:
    """Sizes of one run; ``--quick`` shrinks them for a smoke run."""

    quick: bool
    throughput_n: int
    immediate_n: int
    countdown_n: int
    latency_window_s: float
    rss_n: int
    rss_settle_min_s: float
    rss_settle_max_s: float
    kill_bound_s: float
    producers: int
    admin_url: str
    redis_db: int
    counter_db: int
    #: Threads each producer process publishes from in the ``throughput_threads`` phase.
    producer_threads: int = 1
    #: Throughput rounds per broker (0: THROUGHPUT_ROUNDS, one with ``quick``).
    throughput_rounds: int = 0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench_celery_")))

    @classmethod
    def build(cls, quick: bool, **kw: Any) -> Settings:
        if quick:
            return cls(quick, 2_000, 150, 60, 5.0, 10_000, 10.0, 30.0, 40.0, **kw)
        return cls(quick, 10_000, 500, 300, 10.0, 100_000, 15.0, 60.0, 60.0, **kw)

    @property
    def rounds(self) -> int:
        """Throughput rounds per broker (interleaved; the median is reported)."""
        if self.throughput_rounds:
            return self.throughput_rounds
        return 1 if self.quick else THROUGHPUT_ROUNDS

    @property
    def counter_url(self) -> str:
        return f"{REDIS_BASE}/{self.counter_db}"


# -- subprocess hygiene -------------------------------------------------------------------

_LIVE: set[Worker] = set()


def kill_all() -> None:
    for worker in list(_LIVE):
        worker.kill()


def on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


atexit.register(kill_all)


class Worker:
    """A ``celery worker`` in its own process group (killed with its pool children)."""

    def __init__(self, env: dict[str, str], name: str, logdir: Path) -> None:
        name = safe_name(name)  # a variant's name (delayq@REV) holds a node name's '@'
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        cmd = [sys.executable, "-m", "celery", "-A", "celery_bench_app", "worker",
               "-P", POOL, "-c", str(CONCURRENCY), *WORKER_FLAGS,
               "-n", f"{name}@%h", "-Q", env["BENCH_QUEUE"]]
        self.proc = subprocess.Popen(cmd, cwd=BENCH_DIR, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        _LIVE.add(self)

    def wait_ready(self, timeout: float = 90.0) -> None:
        wait_for_log(self.proc, self.log_path, celery_bench_app.READY_LINE, timeout=timeout)

    def rss(self) -> int:
        """Resident bytes of the worker and its pool children (0 if it is gone)."""
        return tree_rss(self.proc.pid)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self._log.close()
        _LIVE.discard(self)


@contextmanager
def running_worker(env: dict[str, str], name: str, cfg: Settings) -> Iterator[Worker]:
    worker = Worker(env, name, cfg.logdir)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.kill()


# -- producers (separate processes, so publishing does not share the bench's GIL) ----------

_APP: Any = None


def _producer_init(env: dict[str, str], barrier: Any) -> None:
    """Load the app for this broker and open its connection before the clock starts."""
    global _APP
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates us
    os.environ.update(env)
    check_import(env)  # a variant (delayq@REV) publishes with its own revision
    os.nice(int(os.environ.get("BENCH_PRODUCER_NICE", "0")))  # --producer-nice
    celery_bench_app.configure()
    _APP = celery_bench_app.app
    with _APP.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=5)
        producer.maybe_declare(_APP.amqp.queues[_APP.conf.task_default_queue])
    barrier.wait(timeout=120)


def publish(job: tuple[str, int, tuple[Any, ...], dict[str, Any]]) -> tuple[float, float, int]:
    """Publish ``count`` identical tasks on one producer; return (first, last, count)."""
    name, count, args, options = job
    task = _APP.tasks[name]
    first = time.time()
    with _APP.producer_or_acquire() as producer:
        for _ in range(count):
            task.apply_async(args, producer=producer, **options)
    return first, time.time(), count


def publish_threaded(job: tuple[int, tuple[str, int, tuple[Any, ...], dict[str, Any]]]
                     ) -> tuple[float, float, int]:
    """``publish`` from ``threads`` threads of this process at once, sharing its app and the
    app's producer pool (each thread acquires a producer of its own, as Celery's threads pool
    or a web server's request threads do); returns (first, last, count) over all of them."""
    threads, (name, count, args, options) = job
    shares = [count // threads + (i < count % threads) for i in range(threads)]
    spans: list[tuple[float, float, int]] = []
    errors: list[BaseException] = []

    def one(share: int) -> None:
        try:
            spans.append(publish((name, share, args, options)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    pool = [threading.Thread(target=one, args=(s,)) for s in shares if s]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return min(s[0] for s in spans), max(s[1] for s in spans), sum(s[2] for s in spans)


def publish_paced(plan: list[tuple[float, str, float]]) -> int:
    """Publish lag tasks at their planned offsets: ``(offset_s, key, countdown_s or 0)``."""
    task = _APP.tasks["bench.lag"]
    start = time.monotonic()
    with _APP.producer_or_acquire() as producer:
        for offset, key, countdown in plan:
            pause = start + offset - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            now = time.time()
            if countdown:
                eta = now + countdown
                task.apply_async((key, eta), eta=datetime.fromtimestamp(eta, UTC),
                                 producer=producer)
            else:
                task.apply_async((key, now), producer=producer)
    return len(plan)


class Producers:
    """A spawn pool of warmed producer processes for one broker."""

    def __init__(self, env: dict[str, str], processes: int) -> None:
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(processes + 1)
        self.errors: list[BaseException] = []
        with spawn_path(env):  # a variant's processes import delayq from its revision
            self.pool = ctx.Pool(processes, initializer=_producer_init, initargs=(env, barrier))
        try:
            barrier.wait(timeout=120)
        except BaseException:
            self.close()
            raise

    def pids(self) -> list[int]:
        """The producer processes (their CPU is the producers' share)."""
        return [p.pid for p in self.pool._pool]  # type: ignore[attr-defined]

    def submit(self, fn: Callable[..., Any], jobs: list[Any]) -> list[Any]:
        """Start every job; returns the list that fills with results as they complete."""
        done: list[Any] = []
        for job in jobs:
            self.pool.apply_async(fn, (job,), callback=done.append,
                                  error_callback=self.errors.append)
        return done

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()

    def __enter__(self) -> Producers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- broker state -------------------------------------------------------------------------


@dataclass
class BrokerRun:
    """One broker for one phase: its environment and how to look inside it."""

    name: str
    env: dict[str, str]
    db_url: str | None = None  # delayq / sqlalchemy: the fresh PostgreSQL database

    @property
    def queue(self) -> str:
        return self.env["BENCH_QUEUE"]

    def waiting(self) -> int | None:
        """Messages still in the broker and not delivered to any worker (None if unknown)."""
        try:
            return _waiting(self)
        except Exception:  # noqa: BLE001 - informative only; never fail a phase on it
            return None


def _count(db_url: str | None, query: str) -> int:
    assert db_url is not None, "PostgreSQL-backed brokers carry their database URL"
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _waiting(run: BrokerRun) -> int | None:
    if run.name.startswith("delayq"):
        return _count(run.db_url, 'SELECT count(*) FROM delayed_queue WHERE "lockUuid" IS NULL')
    if run.name == "sqlalchemy":
        return _count(run.db_url, "SELECT count(*) FROM kombu_message WHERE visible")
    if run.name == "redis":
        return int(redis.Redis.from_url(run.env["BENCH_BROKER_URL"]).llen(run.queue))
    from kombu import Connection

    with Connection(AMQP_URL) as conn:
        return int(conn.default_channel.queue_declare(run.queue, passive=True).message_count)


def base_env(cfg: Settings, queue: str, url: str, options: dict[str, Any],
              acks_late: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        BENCH_BROKER_URL=url,
        BENCH_TRANSPORT_OPTIONS=json.dumps(options),
        BENCH_QUEUE=queue,
        BENCH_COUNTER_URL=cfg.counter_url,
        BENCH_PREFETCH=str(PREFETCH),
        BENCH_ACKS_LATE="1" if acks_late else "0",
        PYTHONPATH=os.pathsep.join([str(BENCH_DIR), str(REPO_ROOT), env.get("PYTHONPATH", "")]),
    )
    return env


@contextmanager
def broker_state(name: str, phase: str, cfg: Settings, *, acks_late: bool = False
                 ) -> Iterator[BrokerRun]:
    """Fresh broker state for one phase, removed afterwards (also on Ctrl-C)."""
    variant = parse(name)
    if variant is not None:  # delayq@REV, delayq~option=value (bench/_variants.py)
        with broker_state(variant.base, phase, cfg, acks_late=acks_late) as run:
            yield BrokerRun(name, variant_env(run.env, variant), run.db_url)
        return
    queue = f"bench_{phase}_{cfg.run_id}"
    options = KILL_OPTIONS.get(name.split("_")[0], {}) if phase == "kill" else {}
    if name.startswith("delayq_pgbouncer"):
        with fresh_database(cfg.admin_url, prefix="delayq_bench_celery_pgb") as db_url, \
                pgbouncer(cfg.admin_url) as bouncer:
            if name == "delayq_pgbouncer_listen":
                options = {**options, "listen_url": db_url}
            url = "delayq+postgresql://" + bouncer.url(db_url).split("://", 1)[1]
            yield BrokerRun(name, base_env(cfg, queue, url, options, acks_late), db_url)
        return
    if name in ("delayq", "delayq_durable", "delayq_unlogged", "delayq_buffered", "sqlalchemy"):
        if name == "delayq_durable":
            options = {**options, "durable_publish": True}
        if name == "delayq_unlogged":
            options = {**options, "unlogged_table": True}
        if name == "delayq_buffered":
            options = {**options, "publish_linger": BUFFERED_LINGER_S}
        with fresh_database(cfg.admin_url, prefix=f"delayq_bench_celery_{name}") as db_url:
            scheme = "sqla+postgresql+psycopg://" if name == "sqlalchemy" else "delayq+postgresql://"
            url = scheme + db_url.split("://", 1)[1]
            yield BrokerRun(name, base_env(cfg, queue, url, options, acks_late), db_url)
        return
    if name == "redis":
        url = f"{REDIS_BASE}/{cfg.redis_db}"
        client = redis.Redis.from_url(url)
        client.flushdb()
        try:
            yield BrokerRun(name, base_env(cfg, queue, url, options, acks_late))
        finally:
            client.flushdb()
        return
    if name == "amqp_confirm":
        options = {**options, "confirm_publish": True}
    try:
        yield BrokerRun(name, base_env(cfg, queue, AMQP_URL, options, acks_late))
    finally:
        _amqp_delete(queue)


@contextmanager
def pgbouncer(admin_url: str) -> Iterator[Any]:
    """A PgBouncer in transaction pooling in front of the admin URL's server, for one phase
    (the tests' own helper: tests/topology/pgbouncer.py)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from topology.pgbouncer import PgBouncer

    bouncer = PgBouncer(admin_url, mode="transaction").start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


def _amqp_delete(queue: str) -> None:
    """Remove this phase's queue and exchange from the shared RabbitMQ."""
    from kombu import Connection

    with Connection(AMQP_URL) as conn:
        channel = conn.default_channel
        channel.queue_delete(queue)
        channel.exchange_delete(queue)


# -- counters -----------------------------------------------------------------------------


def counter_client(cfg: Settings) -> redis.Redis:
    return redis.Redis.from_url(cfg.counter_url)


def counter_key(cfg: Settings, *parts: str) -> str:
    """A counter of this run only: runs sharing the Redis database never mix."""
    return ":".join(("bench_celery", cfg.run_id, *parts))


def wait_count(cfg: Settings, key: str, total: int, timeout: float, progress: Any,
               task: Any, read: Callable[[redis.Redis, str], int],
               on_sample: Callable[[int], None] | None = None) -> int:
    """Poll a counter until it reaches ``total`` or ``timeout`` passes; returns what it read."""
    client = counter_client(cfg)
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        seen = read(client, key)
        progress.update(task, completed=seen)
        if on_sample is not None:
            on_sample(seen)
        if seen >= total:
            break
        time.sleep(0.05)
    return seen


def count_of(client: redis.Redis, key: str) -> int:
    return int(client.get(key) or 0)


def list_len(client: redis.Redis, key: str) -> int:
    return int(client.llen(key))


def noop_jobs(key: str, n: int) -> list[tuple[str, int, tuple[Any, ...], dict[str, Any]]]:
    """``n`` no-op tasks counting into ``key`` as producer jobs of :data:`CHUNK` tasks."""
    return [("bench.noop", min(CHUNK, n - i), (key, n), {}) for i in range(0, n, CHUNK)]


def delayq_run(db_url: str, cfg: Settings, queue: str, name: str = "delayq") -> BrokerRun:
    """A delayq BrokerRun on a database the caller prepared (far-future rows, a held
    snapshot); ``name`` keys its Redis counters (one per size)."""
    url = "delayq+postgresql://" + db_url.split("://", 1)[1]
    return BrokerRun(name, base_env(cfg, queue, url, {}, acks_late=False), db_url)


def cleanup_counters(cfg: Settings) -> None:
    """Delete this run's counters from the shared Redis database."""
    client = counter_client(cfg)
    keys = list(client.scan_iter(match=counter_key(cfg, "*"), count=1000))
    if keys:
        client.delete(*keys)
