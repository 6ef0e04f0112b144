"""Celery broker benchmark (issue 3): delayq next to Redis, RabbitMQ and kombu's SQLAlchemy.

Every broker runs the same app (``celery_bench_app.py``) under the same real ``celery worker``
subprocess settings; only ``broker_url`` differs (plus each broker's redelivery option in the
kill phase). Phases, each run for every broker in turn before the next phase starts:

- ``throughput``: N no-op tasks published by a pool of producer processes while the worker
  runs; time from the first publish to the last execution (the task that brings a Redis counter
  to N stamps the time: the same one Redis round trip per task for every broker);
- ``latency``: immediate tasks at a steady rate (``time.time() - sent_at`` in the task) and
  countdown tasks with countdowns spread over 2-10 s (``time.time() - eta``);
- ``rss``: worker RSS (main process + pool children) idle, then after 100,000 one-hour
  countdowns are published, sampled until it stops moving (at least 15 s, bounded);
- ``kill``: an ``acks_late`` task starts on worker A, worker B is started and ready, A is
  SIGKILLed; seconds until the task starts again on B.

Each phase gets a fresh broker state: a new PostgreSQL database (delayq, SQLAlchemy), a flushed
Redis database, a new RabbitMQ queue name (deleted afterwards). Writes
``bench/results/celery.json``, ``docs/img/bench_celery_*.png`` and the "Celery broker" section
of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import psutil
import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

import celery_bench_app  # noqa: E402
from _common import (  # noqa: E402
    BENCH_DIR,
    DEFAULT_ADMIN_URL,
    IMG_DIR,
    REPO_ROOT,
    checkpoint,
    console,
    fresh_database,
    grouped_bar_chart,
    machine_info,
    markdown_table,
    progress_bar,
    replace_section,
    save_figure,
    write_results,
)

BROKERS = ("delayq", "delayq_durable", "delayq_unlogged", "delayq_buffered", "redis", "amqp",
           "sqlalchemy")
#: ``delayq_durable`` is delayq with the ``durable_publish=True`` transport option: every
#: publish waits for the WAL flush, to show what that stricter durability costs.
#: ``delayq_unlogged`` sets ``unlogged_table=True`` (no WAL; a crash empties the table), to
#: show what the WAL costs. ``delayq_buffered`` sets ``publish_linger`` (publishes written in
#: batches every BUFFERED_LINGER_S; a publish returns before its row is written).
BUFFERED_LINGER_S = 0.005
VARIANTS: tuple[str, ...] = ()
PHASES = ("throughput", "drain", "latency", "rss", "kill", "sweep")
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
TARGETS = {"latency_p99_ms": 25.0, "rss_growth_mb": 20.0, "throughput_vs_redis": 1.0,
           "kill_s": 10.0}
CHUNK = 500
#: A no-op run lasts ~10 s; on a shared 2-core machine one such window can be 30% off.
THROUGHPUT_ROUNDS = 3
#: A 1-minute load average at start below this (2 cores) counts as a quiet machine.
QUIET_LOAD = 1.5


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
        return 1 if self.quick else THROUGHPUT_ROUNDS

    @property
    def counter_url(self) -> str:
        return f"{REDIS_BASE}/{self.counter_db}"


# -- subprocess hygiene -------------------------------------------------------------------

_LIVE: set[Worker] = set()


def _kill_all() -> None:
    for worker in list(_LIVE):
        worker.kill()


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


atexit.register(_kill_all)


class Worker:
    """A ``celery worker`` in its own process group (killed with its pool children)."""

    def __init__(self, env: dict[str, str], name: str, logdir: Path) -> None:
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        cmd = [sys.executable, "-m", "celery", "-A", "celery_bench_app", "worker",
               "-P", POOL, "-c", str(CONCURRENCY), *WORKER_FLAGS,
               "-n", f"{name}@%h", "-Q", env["BENCH_QUEUE"]]
        self.proc = subprocess.Popen(cmd, cwd=BENCH_DIR, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        _LIVE.add(self)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if celery_bench_app.READY_LINE in self.log_path.read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = self.log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"worker not ready (see {self.log_path}):\n{tail}")

    def rss(self) -> int:
        """Resident bytes of the worker and its pool children (0 if it is gone)."""
        try:
            main = psutil.Process(self.proc.pid)
            procs = [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

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
    os.nice(int(os.environ.get("BENCH_PRODUCER_NICE", "0")))  # --producer-nice
    celery_bench_app.configure()
    _APP = celery_bench_app.app
    with _APP.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=5)
        producer.maybe_declare(_APP.amqp.queues[_APP.conf.task_default_queue])
    barrier.wait(timeout=120)


def _publish(job: tuple[str, int, tuple[Any, ...], dict[str, Any]]) -> tuple[float, float, int]:
    """Publish ``count`` identical tasks on one producer; return (first, last, count)."""
    name, count, args, options = job
    task = _APP.tasks[name]
    first = time.time()
    with _APP.producer_or_acquire() as producer:
        for _ in range(count):
            task.apply_async(args, producer=producer, **options)
    return first, time.time(), count


def _publish_paced(plan: list[tuple[float, str, float]]) -> int:
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
        self.pool = ctx.Pool(processes, initializer=_producer_init, initargs=(env, barrier))
        try:
            barrier.wait(timeout=120)
        except BaseException:
            self.close()
            raise

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


def _base_env(cfg: Settings, queue: str, url: str, options: dict[str, Any],
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
    queue = f"bench_{phase}_{cfg.run_id}"
    options = KILL_OPTIONS.get(name.split("_")[0], {}) if phase == "kill" else {}
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
            yield BrokerRun(name, _base_env(cfg, queue, url, options, acks_late), db_url)
        return
    if name == "redis":
        url = f"{REDIS_BASE}/{cfg.redis_db}"
        client = redis.Redis.from_url(url)
        client.flushdb()
        try:
            yield BrokerRun(name, _base_env(cfg, queue, url, options, acks_late))
        finally:
            client.flushdb()
        return
    try:
        yield BrokerRun(name, _base_env(cfg, queue, AMQP_URL, options, acks_late))
    finally:
        _amqp_delete(queue)


def _amqp_delete(queue: str) -> None:
    """Remove this phase's queue and exchange from the shared RabbitMQ."""
    from kombu import Connection

    with Connection(AMQP_URL) as conn:
        channel = conn.default_channel
        channel.queue_delete(queue)
        channel.exchange_delete(queue)


# -- phases -------------------------------------------------------------------------------


def _counter(cfg: Settings) -> redis.Redis:
    return redis.Redis.from_url(cfg.counter_url)


def _key(cfg: Settings, *parts: str) -> str:
    return ":".join(("bench_celery", cfg.run_id, *parts))


def _wait_count(cfg: Settings, key: str, total: int, timeout: float, progress: Any,
                task: Any, read: Callable[[redis.Redis, str], int],
                on_sample: Callable[[int], None] | None = None) -> int:
    client = _counter(cfg)
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


def _get_int(client: redis.Redis, key: str) -> int:
    return int(client.get(key) or 0)


def _llen(client: redis.Redis, key: str) -> int:
    return int(client.llen(key))


def phase_throughput(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    n = cfg.throughput_n
    fresh = uuid.uuid4().hex[:8]  # counters of their own: this phase runs several rounds
    key, warm_key = _key(cfg, run.name, "tp", fresh), _key(cfg, run.name, "tp-warm", fresh)
    with running_worker(run.env, f"tp-{run.name}", cfg), \
            Producers(run.env, cfg.producers) as producers:
        warm_n = 200
        producers.submit(_publish, [("bench.noop", warm_n, (warm_key, warm_n), {})])
        warm = progress.add_task(f"{run.name}: warm-up", total=warm_n, rate="", unit="tasks")
        _wait_count(cfg, warm_key, warm_n, 120, progress, warm, _get_int)
        jobs: list[tuple[str, int, tuple[Any, ...], dict[str, Any]]] = [
            ("bench.noop", min(CHUNK, n - i), (key, n), {}) for i in range(0, n, CHUNK)]
        ran = progress.add_task(f"{run.name}: no-op executed", total=n, rate="", unit="tasks")
        done = producers.submit(_publish, jobs)
        # How far the worker got while the producers still ran (read within ~50 ms of the
        # last publish): on 2 shared cores the end-to-end time is mostly set by the CPU share
        # the worker gets next to the producers, then by how fast it drains the rest alone.
        at_publish_end: list[int] = []

        def note(seen: int) -> None:
            if not at_publish_end and len(done) == len(jobs):
                at_publish_end.append(seen)

        executed = _wait_count(cfg, key, n, max(180.0, n / 20), progress, ran, _get_int, note)
        done_at = _counter(cfg).get(f"{key}:done")
        if producers.errors:
            raise producers.errors[0]
    if executed < n or done_at is None or not done:
        return {"error": f"only {executed}/{n} tasks ran before the deadline"}
    first, last = min(d[0] for d in done), max(d[1] for d in done)
    seconds = float(done_at) - first
    return {"tasks": n, "executions_counted": executed, "seconds": round(seconds, 3),
            "tasks_per_s": round(n / seconds, 1),
            "publish_seconds": round(last - first, 3),
            "publish_per_s": round(n / (last - first), 1),
            "executed_while_publishing": at_publish_end[0] if at_publish_end else None,
            "worker_per_s_while_publishing":
                round(at_publish_end[0] / (last - first), 1) if at_publish_end else None,
            "tail_seconds": round(float(done_at) - last, 3)}


def _latency_plan(cfg: Settings, imm_key: str, cd_key: str) -> list[tuple[float, str, float]]:
    rng = random.Random(7)
    window = cfg.latency_window_s
    plan = [(i * window / cfg.immediate_n, imm_key, 0.0) for i in range(cfg.immediate_n)]
    plan += [((i + 0.5) * window / cfg.countdown_n, cd_key, rng.uniform(2.0, 10.0))
             for i in range(cfg.countdown_n)]
    return sorted(plan)


def _percentiles(values_s: list[float]) -> dict[str, Any]:
    ms = sorted(v * 1000 for v in values_s)
    if not ms:
        return {"n": 0}
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"n": len(ms), "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2),
            "max_ms": round(ms[-1], 2), "min_ms": round(ms[0], 2),
            "samples_ms": [round(v, 3) for v in ms]}


def phase_latency(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    imm_key, cd_key = _key(cfg, run.name, "imm"), _key(cfg, run.name, "cd")
    warm_key = _key(cfg, run.name, "lat-warm")
    total = cfg.immediate_n + cfg.countdown_n
    with running_worker(run.env, f"lat-{run.name}", cfg), Producers(run.env, 1) as producers:
        warm = progress.add_task(f"{run.name}: warm-up", total=20, rate="", unit="tasks")
        producers.submit(_publish_paced, [[(i * 0.05, warm_key, 0.0) for i in range(20)]])
        _wait_count(cfg, warm_key, 20, 120, progress, warm, _llen)
        producers.submit(_publish_paced, [_latency_plan(cfg, imm_key, cd_key)])
        bar = progress.add_task(f"{run.name}: latency samples", total=total, rate="",
                                unit="tasks")
        _wait_count(cfg, "", total, cfg.latency_window_s + 40, progress, bar,
                    lambda c, _k: _llen(c, imm_key) + _llen(c, cd_key))
        if producers.errors:
            raise producers.errors[0]
    client = _counter(cfg)
    values = {k: [float(v) for v in client.lrange(k, 0, -1)] for k in (imm_key, cd_key)}
    return {"immediate": _percentiles(values[imm_key]),
            "countdown": _percentiles(values[cd_key]),
            "expected": {"immediate": cfg.immediate_n, "countdown": cfg.countdown_n}}


def _settle(worker: Worker, run: BrokerRun, cfg: Settings, progress: Any, task: Any
            ) -> tuple[list[int], list[int | None]]:
    """Sample RSS and the broker's backlog every second until both stop moving.

    At least the minimum, at most the maximum; "stopped" means the last 5 samples agree within
    1 MB and the backlog (messages the worker has not taken yet) did not change.
    """
    samples: list[int] = []
    backlog: list[int | None] = []
    start = time.monotonic()
    while True:
        samples.append(worker.rss())
        backlog.append(run.waiting())
        elapsed = time.monotonic() - start
        progress.update(task, completed=min(elapsed, cfg.rss_settle_max_s),
                        rate=f"{samples[-1] / MB:8.1f} MB, {backlog[-1]} in broker")
        tail, waiting = samples[-5:], set(backlog[-5:])
        stable = len(tail) == 5 and max(tail) - min(tail) <= MB and len(waiting) == 1
        if elapsed >= cfg.rss_settle_max_s or (elapsed >= cfg.rss_settle_min_s and stable):
            return samples, backlog
        time.sleep(1.0)


def phase_rss(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    n = cfg.rss_n
    with running_worker(run.env, f"rss-{run.name}", cfg) as worker, \
            Producers(run.env, cfg.producers) as producers:
        idle_samples = []
        for _ in range(5):
            time.sleep(1.0)
            idle_samples.append(worker.rss())
        idle = statistics.median(idle_samples)
        jobs = [("bench.hour", min(1000, n - i), (), {"countdown": 3600})
                for i in range(0, n, 1000)]
        bar = progress.add_task(f"{run.name}: publish 1 h countdowns", total=n, rate="",
                                unit="tasks")
        done = producers.submit(_publish, jobs)
        peak = idle
        deadline = time.monotonic() + max(600.0, n / 50)
        while len(done) < len(jobs) and time.monotonic() < deadline and not producers.errors:
            peak = max(peak, worker.rss())
            progress.update(bar, completed=sum(d[2] for d in done),
                            rate=f"RSS {peak / MB:7.1f} MB")
            time.sleep(0.25)
        if producers.errors:
            raise producers.errors[0]
        published = sum(d[2] for d in done)
        progress.update(bar, completed=published)
        settle = progress.add_task(f"{run.name}: RSS settling", total=cfg.rss_settle_max_s,
                                   rate="", unit="s")
        samples, backlog = _settle(worker, run, cfg, progress, settle)
        alive = worker.proc.poll() is None
    after, waiting = samples[-1], backlog[-1]
    held = None if waiting is None else published - waiting
    growth = (after - idle) / MB
    return {"published": published, "idle_mb": round(idle / MB, 1),
            "after_mb": round(after / MB, 1), "growth_mb": round(growth, 1),
            "peak_mb": round(max(peak, *samples) / MB, 1),
            "still_growing": samples[-1] - samples[max(0, len(samples) - 5)] > MB,
            "settle_seconds": len(samples), "waiting_in_broker": waiting,
            "held_by_worker": held,
            "kb_per_held_task": round(growth * 1024 / held, 2) if held else None,
            "worker_alive": alive}


def phase_kill(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    key = _key(cfg, run.name, "kill")
    client = _counter(cfg)
    bar = progress.add_task(f"{run.name}: kill A, wait for B", total=2, rate="", unit="starts")
    a = Worker(run.env, f"kill-a-{run.name}", cfg.logdir)
    try:
        a.wait_ready()
        with Producers(run.env, 1) as producers:
            producers.submit(_publish, [("bench.sleepy", 1, (key, 600.0), {})])
            if _wait_count(cfg, key, 1, 60, progress, bar, _llen) < 1:
                return {"error": "the long task never started on worker A"}
        with running_worker(run.env, f"kill-b-{run.name}", cfg):
            killed_at = time.time()
            a.kill()
            seen = _wait_count(cfg, key, 2, cfg.kill_bound_s, progress, bar, _llen)
            starts = [json.loads(s) for s in client.lrange(key, 0, -1)]
    finally:
        a.kill()
    if seen < 2:
        return {"rerun": False, "bound_s": cfg.kill_bound_s,
                "options": json.loads(run.env["BENCH_TRANSPORT_OPTIONS"])}
    second = starts[1]
    return {"rerun": True, "seconds": round(second["at"] - killed_at, 3),
            "redelivered_flag": second["redelivered"], "on": second["hostname"],
            "options": json.loads(run.env["BENCH_TRANSPORT_OPTIONS"])}


def phase_drain(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    """The consumer side alone: the no-ops are queued first, then one worker drains them with
    no producer competing for the CPU. Reports the rate and the worker main process' CPU per
    task, the figure the end-to-end run blurs with everything else on the machine."""
    n = cfg.throughput_n
    key = _key(cfg, run.name, "drain", uuid.uuid4().hex[:8])
    jobs: list[tuple[str, int, tuple[Any, ...], dict[str, Any]]] = [
        ("bench.noop", min(CHUNK, n - i), (key, n), {}) for i in range(0, n, CHUNK)]
    queued = progress.add_task(f"{run.name}: queued", total=len(jobs), rate="", unit="chunks")
    with Producers(run.env, cfg.producers) as producers:
        done = producers.submit(_publish, jobs)
        deadline = time.monotonic() + max(180.0, n / 20)
        while len(done) < len(jobs) and not producers.errors and time.monotonic() < deadline:
            progress.update(queued, completed=len(done))
            time.sleep(0.05)
        if producers.errors or len(done) < len(jobs):
            raise producers.errors[0] if producers.errors else TimeoutError("publishing")
    with running_worker(run.env, f"drain-{run.name}", cfg) as worker:
        main = psutil.Process(worker.proc.pid)
        started, cpu_start = time.time(), sum(main.cpu_times()[:2])
        ran = progress.add_task(f"{run.name}: drained", total=n, rate="", unit="tasks")
        executed = _wait_count(cfg, key, n, max(180.0, n / 20), progress, ran, _get_int)
        cpu_s = sum(main.cpu_times()[:2]) - cpu_start
        done_at = _counter(cfg).get(f"{key}:done")
    if executed < n or done_at is None:
        return {"error": f"only {executed}/{n} tasks ran before the deadline"}
    seconds = float(done_at) - started
    return {"tasks": n, "seconds": round(seconds, 3), "tasks_per_s": round(n / seconds, 1),
            "worker_main_cpu_ms_per_task": round(cpu_s * 1000 / n, 3)}


#: The sweep's grid: producer processes x worker processes (each worker ``-c 2``).
SWEEP_PRODUCERS = (1, 2, 4)
SWEEP_WORKERS = (1, 2, 4)


class ServerCpu:
    """CPU seconds of the broker's server side: for PostgreSQL-backed brokers the backends
    serving this phase's database (found by name in pg_stat_activity, so other users of a
    shared server are not counted; the WAL writer and checkpointer are left out), RabbitMQ's
    ``beam.smp``, ``redis-server``. A backend started meanwhile counts from zero."""

    def __init__(self, run: BrokerRun, admin_url: str) -> None:
        self.run, self.admin_url = run, admin_url
        self.start = {p.pid: self._cpu(p) for p in self._procs()}

    @staticmethod
    def _cpu(proc: psutil.Process) -> float:
        try:
            times = proc.cpu_times()
            return float(times.user + times.system)
        except psutil.Error:
            return 0.0

    def _procs(self) -> list[psutil.Process]:
        if self.run.db_url is not None:
            dbname = self.run.db_url.rsplit("/", 1)[1]
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                pids = [r[0] for r in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> "
                    "pg_backend_pid()", (dbname,))]
            procs = []
            for pid in pids:
                try:
                    procs.append(psutil.Process(pid))
                except psutil.NoSuchProcess:
                    pass
            return procs
        name = "redis-server" if self.run.name == "redis" else "beam.smp"
        return [p for p in psutil.process_iter(["name"]) if p.info["name"] == name]

    def used(self) -> float:
        return sum(self._cpu(p) - self.start.get(p.pid, 0.0) for p in self._procs())


def _tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in (proc, *proc.children(recursive=True)):
                total += ServerCpu._cpu(p)
        except psutil.NoSuchProcess:
            pass
    return total


def _sweep_point(run: BrokerRun, cfg: Settings, progress: Any, workers: list[Worker],
                 producers: int, n: int) -> dict[str, Any]:
    key = _key(cfg, run.name, "sweep", uuid.uuid4().hex[:8])
    jobs: list[tuple[str, int, tuple[Any, ...], dict[str, Any]]] = [
        ("bench.noop", min(CHUNK, n - i), (key, n), {}) for i in range(0, n, CHUNK)]
    with Producers(run.env, producers) as pool:
        producer_pids = [p.pid for p in pool.pool._pool]  # type: ignore[attr-defined]
        worker_pids = [w.proc.pid for w in workers]
        server = ServerCpu(run, cfg.admin_url)
        cpu0 = (_tree_cpu(worker_pids), _tree_cpu(producer_pids))
        psutil.cpu_percent()
        done = pool.submit(_publish, jobs)
        ran = progress.add_task(f"{run.name}: {producers}P x {len(workers)}W", total=n,
                                rate="", unit="tasks")
        executed = _wait_count(cfg, key, n, max(180.0, n / 20), progress, ran, _get_int)
        busy = psutil.cpu_percent()
        done_at = _counter(cfg).get(f"{key}:done")
        server_s = server.used()
        worker_s = _tree_cpu(worker_pids) - cpu0[0]
        producer_s = _tree_cpu(producer_pids) - cpu0[1]
        if pool.errors:
            raise pool.errors[0]
    if executed < n or done_at is None or not done:
        return {"producers": producers, "workers": len(workers),
                "error": f"only {executed}/{n} tasks ran"}
    seconds = float(done_at) - min(d[0] for d in done)
    return {"producers": producers, "workers": len(workers), "tasks_per_s": round(n / seconds, 1),
            "machine_busy_pct": busy,
            "server_cores": round(server_s / seconds, 2),
            "server_cpu_us_per_task": round(server_s * 1e6 / n),
            "workers_cpu_us_per_task": round(worker_s * 1e6 / n),
            "producers_cpu_us_per_task": round(producer_s * 1e6 / n)}


def phase_sweep(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    """Producer processes x worker processes, end to end, with the CPU each side used. On a
    machine with few cores everything competes for them; what scales is read from the CPU per
    task of each side (the broker server's above all), not from the rates alone."""
    n = cfg.throughput_n // 2
    points = []
    for count in SWEEP_WORKERS:
        workers: list[Worker] = []
        try:
            for i in range(count):
                workers.append(Worker(run.env, f"sw{count}-{i}-{run.name}", cfg.logdir))
            for worker in workers:
                worker.wait_ready()
            for producers in SWEEP_PRODUCERS:
                checkpoint(cfg.admin_url)
                points.append(_sweep_point(run, cfg, progress, workers, producers, n))
        finally:
            for worker in workers:
                worker.kill()
    return {"tasks": n, "points": points}


PHASE_FUNCS = {"throughput": phase_throughput, "latency": phase_latency, "rss": phase_rss,
               "kill": phase_kill, "drain": phase_drain, "sweep": phase_sweep}


def run_all(cfg: Settings, brokers: list[str], phases: list[str]) -> dict[str, Any]:
    """Every phase for every broker; throughput ``cfg.rounds`` times, brokers interleaved, so
    a slow minute of a shared machine does not land on one broker only (median reported).
    Every phase starts after a CHECKPOINT, so none pays for the previous one's writes."""
    results: dict[str, dict[str, Any]] = {b: {} for b in brokers}
    plan = [(phase, rnd) for phase in phases
            for rnd in range(cfg.rounds if phase == "throughput" else 1)]
    with progress_bar() as progress:
        overall = progress.add_task("phases", total=len(brokers) * len(plan), rate="",
                                    unit="runs")
        for phase, rnd in plan:
            # Rounds rotate the order, so no broker always runs right after the same peer.
            for broker in brokers[rnd % len(brokers):] + brokers[:rnd % len(brokers)]:
                checkpoint(cfg.admin_url)
                try:
                    with broker_state(broker, phase, cfg, acks_late=phase == "kill") as run:
                        outcome = PHASE_FUNCS[phase](run, cfg, progress)
                except Exception as exc:  # noqa: BLE001 - one broker failing must not end the run
                    console.print(f"[red]{broker}/{phase} failed: {exc!r}")
                    outcome = {"error": repr(exc)}
                results[broker].setdefault(f"{phase}_rounds", []).append(outcome)
                progress.advance(overall)
    for broker_results in results.values():
        for phase in phases:
            broker_results[phase] = _median_round(broker_results.pop(f"{phase}_rounds"))
    return results


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median throughput (the only phase with several), all rates kept."""
    if len(rounds) == 1:
        return rounds[0]
    ok = sorted((r for r in rounds if "tasks_per_s" in r), key=lambda r: r["tasks_per_s"])
    if not ok:
        return rounds[0]
    return {**ok[(len(ok) - 1) // 2], "rounds_tasks_per_s": [r.get("tasks_per_s") for r in rounds]}


# -- report -------------------------------------------------------------------------------


def _get(results: dict[str, Any], broker: str, phase: str, *path: str) -> Any:
    value: Any = results.get(broker, {}).get(phase, {})
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _ratio(value: Any, base: Any) -> str:
    if not isinstance(value, int | float) or not isinstance(base, int | float) or not base:
        return "—"
    return f"{value / base:.2f}×"


def _met(ok: bool | None) -> str:
    return "—" if ok is None else ("yes" if ok else "**no**")


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and unit == "tasks/s":
        return f"{value:,.0f} {unit}"
    return f"{value:,} {unit}" if isinstance(value, int) else f"{value:,.2f} {unit}"


def table_rows(results: dict[str, Any], brokers: list[str]) -> list[list[str]]:
    """(broker, metric, value, ratio vs Redis, target, met?) for every figure measured."""
    rows: list[list[str]] = []
    specs: list[tuple[str, tuple[str, ...], str, str, Callable[[Any, Any], bool | None]]] = [
        ("no-op end-to-end", ("throughput", "tasks_per_s"), "tasks/s", "≥ 1.0× Redis",
         lambda v, r: None if v is None or r is None else v >= r * TARGETS["throughput_vs_redis"]),
        ("publish rate", ("throughput", "publish_per_s"), "tasks/s", "", lambda v, r: None),
        ("executed while publishing", ("throughput", "worker_per_s_while_publishing"),
         "tasks/s", "", lambda v, r: None),
        ("drained after the last publish", ("throughput", "tail_seconds"), "s", "",
         lambda v, r: None),
        ("worker alone, queue drained", ("drain", "tasks_per_s"), "tasks/s", "",
         lambda v, r: None),
        ("worker main CPU per task", ("drain", "worker_main_cpu_ms_per_task"), "ms", "",
         lambda v, r: None),
    ]
    for kind in ("immediate", "countdown"):
        label = "pick-up latency" if kind == "immediate" else "countdown lateness"
        specs.append((f"{label} p50", ("latency", kind, "p50_ms"), "ms", "", lambda v, r: None))
        specs.append((f"{label} p99", ("latency", kind, "p99_ms"), "ms", "≤ 25 ms",
                      lambda v, r: None if v is None else v <= TARGETS["latency_p99_ms"]))
    specs += [
        ("RSS idle", ("rss", "idle_mb"), "MB", "", lambda v, r: None),
        ("RSS after 1 h countdowns", ("rss", "after_mb"), "MB", "", lambda v, r: None),
        ("RSS growth", ("rss", "growth_mb"), "MB", "≤ 20 MB",
         lambda v, r: None if v is None else v <= TARGETS["rss_growth_mb"]),
        ("killed acks_late task runs again after", ("kill", "seconds"), "s",
         "≤ 10 s (acquire_timeout)",
         lambda v, r: None if v is None else v <= TARGETS["kill_s"]),
    ]
    for label, path, unit, target, check in specs:
        base = _get(results, "redis", *path)
        for broker in brokers:
            value = _get(results, broker, *path)
            if value is None and not _get(results, broker, path[0]):
                continue
            shown = _fmt(value, unit)
            if path[0] == "kill" and value is None:
                shown = f"not within {_get(results, broker, 'kill', 'bound_s')} s"
            if path[:2] == ("rss", "after_mb"):
                shown += _held_note(results, broker)
            rounds = _get(results, broker, "throughput", "rounds_tasks_per_s")
            if path == ("throughput", "tasks_per_s") and rounds:
                shown += " (median of " + ", ".join(
                    "failed" if r is None else f"{r:,.0f}" for r in rounds) + ")"
            is_delayq = broker == "delayq" and target
            rows.append([broker, label, shown, _ratio(value, base),
                         _ratio(value, _get(results, "amqp", *path)),
                         target if is_delayq else "",
                         _met(check(value, base)) if is_delayq else ""])
    return rows


SWEEP_HEADERS = ["broker", "producers", "workers", "tasks/s", "machine busy %",
                 "broker server cores", "server µs/task", "workers µs/task", "producers µs/task"]


def sweep_rows(results: dict[str, Any], brokers: list[str]) -> list[list[str]]:
    rows = []
    for broker in brokers:
        for p in (results.get(broker, {}).get("sweep") or {}).get("points", []):
            if "error" in p:
                rows.append([broker, str(p["producers"]), str(p["workers"]), p["error"]]
                            + [""] * 5)
                continue
            rows.append([broker, str(p["producers"]), str(p["workers"]),
                         f"{p['tasks_per_s']:,.0f}",
                         f"{p['machine_busy_pct']:.0f}", f"{p['server_cores']:.2f}",
                         str(p["server_cpu_us_per_task"]), str(p["workers_cpu_us_per_task"]),
                         str(p["producers_cpu_us_per_task"])])
    return rows


def _held_note(results: dict[str, Any], broker: str) -> str:
    rss = results.get(broker, {}).get("rss", {})
    notes = []
    if rss.get("held_by_worker") is not None:
        notes.append(f"worker holds {rss['held_by_worker']:,} of {rss['published']:,}")
    if rss.get("still_growing"):
        notes.append("still growing")
    return f" ({', '.join(notes)})" if notes else ""


def write_plots(results: dict[str, Any], brokers: list[str]) -> dict[str, Path]:
    plots: dict[str, Path] = {}
    with_tp = [b for b in brokers if _get(results, b, "throughput", "tasks_per_s")]
    if with_tp:
        plots["throughput"] = grouped_bar_chart(
            IMG_DIR / "bench_celery_throughput.png", with_tp,
            {"end-to-end (publish → last run)": [
                _get(results, b, "throughput", "tasks_per_s") for b in with_tp],
             "publish only": [_get(results, b, "throughput", "publish_per_s") for b in with_tp]},
            title="No-op task throughput", ylabel="tasks/s")
    with_rss = [b for b in brokers if _get(results, b, "rss", "after_mb")]
    if with_rss:
        plots["rss"] = grouped_bar_chart(
            IMG_DIR / "bench_celery_rss.png", with_rss,
            {"idle": [_get(results, b, "rss", "idle_mb") for b in with_rss],
             "after the 1 h countdowns": [_get(results, b, "rss", "after_mb") for b in with_rss]},
            title="Worker RSS (main + pool children)", ylabel="MB")
    with_lat = [b for b in brokers if _get(results, b, "latency", "immediate", "samples_ms")]
    if with_lat:
        plots["latency"] = _latency_cdf(results, with_lat)
    return plots


def _latency_cdf(results: dict[str, Any], brokers: list[str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    titles = {"immediate": "Pick-up latency (send → run)", "countdown": "Countdown lateness"}
    for ax, kind in zip(axes, ("immediate", "countdown"), strict=True):
        for broker in brokers:
            ms = _get(results, broker, "latency", kind, "samples_ms") or []
            if ms:
                ax.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], label=broker)
        ax.axvline(TARGETS["latency_p99_ms"], color="grey", linestyle=":", label="25 ms")
        ax.axhline(0.99, color="grey", linestyle="--", linewidth=0.6)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of tasks")
        ax.set_title(titles[kind])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, IMG_DIR / "bench_celery_latency.png")


def _missed(results: dict[str, Any], brokers: list[str]) -> list[str]:
    return [f"{row[1]}: {row[2]}" for row in table_rows(results, brokers)
            if row[0] == "delayq" and row[-1] == "**no**"]


def docs_section(results: dict[str, Any], brokers: list[str], cfg: Settings,
                 info: dict[str, Any], plots: dict[str, Path]) -> str:
    load = f"{info['load_average_at_start'][0]:.1f} → {info['load_average_at_end'][0]:.1f}"
    rows = table_rows(results, brokers)
    images = "\n\n".join(f"![{name}](img/{path.name})" for name, path in plots.items())
    missed = _missed(results, brokers)
    missed_md = ("\n".join(f"- {m}" for m in missed) if missed else "- none")
    errors = [f"- {b}/{p}: `{v['error']}`" for b in brokers for p, v in results[b].items()
              if isinstance(v, dict) and "error" in v]
    kill_note = "\n".join(
        f"- {b}: " + (f"ran again after {v['seconds']} s on `{v['on']}`, redelivered flag "
                      f"{v['redelivered_flag']}" if v.get("rerun") else
                      f"did not run again within {v.get('bound_s')} s")
        for b in brokers if isinstance(v := results[b].get("kill"), dict) and "error" not in v)
    per_task = ", ".join(
        f"{b} {v['kb_per_held_task']} KB" for b in brokers
        if isinstance(v := results[b].get("rss"), dict) and v.get("kb_per_held_task")) or "n/a"
    quiet_note = ("" if info["load_average_at_start"][0] < QUIET_LOAD else
                  " — **measured under load**: treat the figures as indicative")
    rounds_note = ("one round" if cfg.rounds == 1 else
                   f"{cfg.rounds} rounds with the brokers interleaved, the median shown")
    return f"""## Celery broker

`bench/bench_celery.py{' --quick' if cfg.quick else ''}` — {info['cpu_count']} cores
({info['cpu_model']}), PostgreSQL {info['postgresql']['server_version']}, Python
{info['python']}, run {cfg.run_id}; 1-minute load average {load}{quiet_note}.

Same for every broker: the app `bench/celery_bench_app.py`, real `celery worker` subprocesses
with `-P {POOL} -c {CONCURRENCY}`, `worker_prefetch_multiplier={PREFETCH}`,
`{' '.join(WORKER_FLAGS)}`, `task_ignore_result=True`, default transport options (except the
kill phase, below). Every task reports to a Redis counter database with one round trip, whatever
the broker. Brokers: delayq `delayq+postgresql://` and kombu SQLAlchemy
`sqla+postgresql+psycopg://` each on a fresh database per phase, `redis://…/{cfg.redis_db}`
(flushed per phase), RabbitMQ `amqp://` (a new queue per phase, deleted afterwards).

Workloads: {cfg.throughput_n:,} no-op tasks published by {cfg.producers} producer processes
while the worker runs (first publish → last execution), {rounds_note}; the same
{cfg.throughput_n:,} queued first and drained by a worker alone (its main process' CPU per
task from psutil);
{cfg.immediate_n} immediate tasks at a steady rate over {cfg.latency_window_s:g} s
(`time.time() - sent_at` in the task) and
{cfg.countdown_n} countdown tasks with countdowns of 2-10 s (`time.time() - eta`);
{cfg.rss_n:,} `apply_async(countdown=3600)` while the worker is idle, RSS of the worker and
its pool children sampled each second until stable (at least {cfg.rss_settle_min_s:g} s, at
most {cfg.rss_settle_max_s:g} s); an `acks_late` task started on worker A, worker B started, A
SIGKILLed (with its pool), seconds until the task starts on B.

{markdown_table(["broker", "metric", "value", "ratio vs Redis", "ratio vs RabbitMQ", "target",
                 "met?"], rows, "llrrrll")}

{images}

Targets missed by delayq in this run:
{missed_md}

Kill phase:
{kill_note or "- not run"}

Notes:
- Redis and RabbitMQ deliver countdown tasks to the worker at once and the worker keeps them
  in memory on a timer until due; that is their RSS growth, and their low countdown lateness.
  delayq keeps them in PostgreSQL (`scheduledAt` = ETA) and the worker wakes on a timer for the
  earliest one. kombu's SQLAlchemy transport, like Redis, hands countdowns to the worker (it
  fetches one message per query, so it may not have taken them all when sampling ends).
- Kill phase options: delayq `acquire_timeout=10`; Redis `visibility_timeout=10` with
  `unacked_restore_throttle=1` (restore sweep every 10 s). With Redis' defaults
  (`visibility_timeout` 3600 s, a sweep only every ~100 s) the killed task runs again only
  about an hour later. RabbitMQ requeues unacked messages as soon as the connection drops.
  kombu's SQLAlchemy transport marks a delivered message invisible and never restores it, so a
  killed worker's task is not run again.
- RabbitMQ: Celery raises the channel's prefetch by one for each ETA message it receives, so
  a worker pulls countdown messages about one round trip at a time; the "worker holds" figure
  says how many it had taken when sampling stopped. Memory per held countdown:
  {per_task}.
- `delayq` runs with its defaults: a publish returns once its row is committed, before the
  WAL flush, so a PostgreSQL crash (not a restart) may lose the last ~0.6 s of publishes — the
  durability of Celery's default brokers (Redis' default persistence, RabbitMQ without
  publisher confirms). `delayq_durable` sets `durable_publish=True`: every publish waits for
  the flush, and survives any crash once `apply_async` returned. Acks and leases skip the
  flush wait in both (a crash can only cause redeliveries).
- RabbitMQ's `consumer_timeout` (30 min by default) closes the channel of a consumer holding
  an unacked delivery longer than that; one-hour countdowns held by a worker hit it (the
  channel is closed and the messages redelivered), which this short run does not reach.
{chr(10).join(["", "Errors:", *errors]) if errors else ""}
"""


@click.command()
@click.option("--quick", is_flag=True, help="Small sizes for a smoke run.")
@click.option("--only", default=",".join(p for p in PHASES if p != "sweep"), show_default=True,
              help="Comma-separated phases: throughput,drain,latency,rss,kill, and sweep "
                   "(1/2/4 producers x 1/2/4 workers; not run by default).")
@click.option("--brokers", "brokers_opt", show_default=True,
              default=",".join(b for b in BROKERS
                               if b not in ("delayq_unlogged", "delayq_buffered")),
              help="Comma-separated brokers: delayq,redis,amqp,sqlalchemy (and "
                   "delayq_durable: delayq with durable_publish=True; delayq_unlogged: with "
                   "unlogged_table=True; delayq_buffered: with publish_linger=0.005).")
@click.option("--admin-url", default=DEFAULT_ADMIN_URL, show_default=True,
              help="PostgreSQL URL allowed to create the per-phase databases.")
@click.option("--redis-db", default=11, show_default=True, help="Redis db used as the broker.")
@click.option("--counter-db", default=12, show_default=True, help="Redis db for the counters.")
@click.option("--producers", default=2, show_default=True, help="Producer processes.")
@click.option("--producer-nice", default=0, show_default=True,
              help="Niceness of the producer processes (every broker alike): a diagnostic of "
                   "how much the end-to-end figure depends on the CPU share producers take "
                   "from the worker on a small machine. The recorded runs use 0.")
@click.option("--no-write", is_flag=True,
              help="Only print the table: no results file, plots or docs (smoke runs).")
def main(quick: bool, only: str, brokers_opt: str, admin_url: str, redis_db: int,
         counter_db: int, producers: int, producer_nice: int, no_write: bool) -> None:
    """Benchmark Celery on delayq, Redis, RabbitMQ and kombu's SQLAlchemy transport."""
    if producer_nice:
        if not no_write:
            raise click.BadParameter("a diagnostic: use it with --no-write",
                                     param_hint="--producer-nice")
        os.environ["BENCH_PRODUCER_NICE"] = str(producer_nice)
    phases = _choices(only, PHASES, "--only")
    brokers = _choices(brokers_opt, BROKERS + VARIANTS, "--brokers")
    if redis_db == counter_db:
        raise click.BadParameter("must differ from --counter-db", param_hint="--redis-db")
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Ctrl-C must reach us even when started from a shell that ignores SIGINT in the background.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = Settings.build(quick, producers=producers, admin_url=admin_url, redis_db=redis_db,
                         counter_db=counter_db)
    info = machine_info(admin_url)
    console.print(f"run {cfg.run_id}: worker logs in {cfg.logdir}")
    try:
        results = run_all(cfg, brokers, phases)
    finally:
        _kill_all()
        _cleanup_counters(cfg)
    info["load_average_at_end"] = list(os.getloadavg())
    console.print(markdown_table(["broker", "metric", "value", "ratio vs Redis",
                                  "ratio vs RabbitMQ", "target", "met?"],
                                 table_rows(results, brokers)))
    if "sweep" in phases:
        console.print(markdown_table(SWEEP_HEADERS, sweep_rows(results, brokers)))
    if no_write:
        return
    plots = write_plots(results, brokers)
    settings = {"pool": POOL, "concurrency": CONCURRENCY, "prefetch_multiplier": PREFETCH,
                "worker_flags": list(WORKER_FLAGS), "kill_options": KILL_OPTIONS,
                "quick": quick, **{k: v for k, v in vars(cfg).items()
                                   if isinstance(v, int | float | str) and k != "admin_url"}}
    path = write_results("celery", {"machine": info, "measured_under_load": True,
                                    "settings": settings, "targets": TARGETS,
                                    "results": results})
    doc = replace_section("celery", docs_section(results, brokers, cfg, info, plots))
    console.print(f"results: {path}\ndocs: {doc}")


def _choices(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        raise click.BadParameter(f"unknown {unknown or value!r}; choose from {allowed}",
                                 param_hint=flag)
    return [v for v in allowed if v in chosen]


def _cleanup_counters(cfg: Settings) -> None:
    client = _counter(cfg)
    keys = list(client.scan_iter(match=_key(cfg, "*"), count=1000))
    if keys:
        client.delete(*keys)


if __name__ == "__main__":
    main()
