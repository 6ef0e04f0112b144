"""The harness, written once: fresh state per run, worker and producer processes, the reports
the tasks make, and the meters beside them (CPU, memory, NOTIFYs).

Each run of a scenario on a system gets a fresh state (:func:`state`): a new PostgreSQL
database (the system's schema installed), a flushed Redis database, or RabbitMQ queues removed
afterwards; its own queue name and Redis keys; the system's app environment
(``systems.app_env``). Workers run in their own process groups (killed with their children);
producers are processes that connect, then start together on the harness' go
(``apps/report.py``), or threads of the worker for in-memory brokers.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import redis
from psycopg import sql
from rich.console import Console
from systems import (
    AMQP_URL,
    REDIS_BROKER_URL,
    System,
    app_env,
    install_commands,
    producer_command,
    worker_command,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
APPS_DIR = BENCH_DIR / "apps"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/13"
TABLE = "delayed_queue"
MB = 1024 * 1024
console = Console(stderr=True)


# -- databases ----------------------------------------------------------------------------


def url_for(admin_url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{dbname}"))


@contextlib.contextmanager
def fresh_database(admin_url: str, prefix: str = "bench") -> Iterator[str]:
    """An empty database for one run, dropped afterwards (also on Ctrl-C)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}".replace("-", "_")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield url_for(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def checkpoint(admin_url: str) -> None:
    """Dirty pages flushed now, so a run does not pay for the checkpoint the last one left."""
    with psycopg.connect(admin_url, autocommit=True) as admin, \
            contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        admin.execute("CHECKPOINT")


def execute(url: str, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


# -- processes ----------------------------------------------------------------------------


class Proc:
    """A process in its own process group, killed with its children; log in ``log``."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(cmd, cwd=APPS_DIR, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def wait_for_line(self, line: str, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.log_path.read_text(errors="replace").count(line) < count:
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready ({self.log_path}):\n{self.tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._log.close()


def tree(pid: int) -> list[psutil.Process]:
    try:
        main = psutil.Process(pid)
        return [main, *main.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def tree_cpu(pids: Iterable[int]) -> float:
    return sum(cpu_seconds(p) for pid in pids for p in tree(pid))


def tree_rss(pid: int) -> int:
    total = 0
    for proc in tree(pid):
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


# -- one run's state ------------------------------------------------------------------------


@dataclass
class Ctx:
    """One run of one scenario on one system: its state, environment and Redis keys."""

    system: System
    admin_url: str
    env: dict[str, str]
    url: str | None
    queue: str
    key: str
    logdir: Path
    params: dict[str, Any]
    tree: Path | None = None
    rc: redis.Redis = field(default_factory=lambda: redis.Redis.from_url(REDIS_URL))
    procs: list[Proc] = field(default_factory=list)

    def k(self, *parts: object) -> str:
        return ":".join((self.key, *map(str, parts)))

    def log(self, what: str) -> Path:
        """A log of its own per process: a ready line is looked for in it."""
        return self.logdir / f"{self.queue}-{what}-{uuid.uuid4().hex[:4]}.log"


def python_path(tree: Path | None) -> str:
    """apps/ first, then the delayq to measure (a revision's tree, or this checkout)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() != REPO_ROOT]
    return os.pathsep.join([str(APPS_DIR), str(tree or REPO_ROOT), *rest])


@contextlib.contextmanager
def state(system: System, tree: Path | None, admin_url: str, logdir: Path,
          params: dict[str, Any], options: Mapping[str, Any] | None = None,
          extra_env: Mapping[str, str] | None = None) -> Iterator[Ctx]:
    """A fresh state for one run (see the module's docstring), removed afterwards."""
    queue = f"b{uuid.uuid4().hex[:10]}"
    with contextlib.ExitStack() as stack:
        url = None
        if system.database:
            url = stack.enter_context(fresh_database(admin_url, f"bench_{system.framework}"))
        if system.broker == "redis":
            flush = redis.Redis.from_url(REDIS_BROKER_URL).flushdb
            flush()
            stack.callback(flush)
        if system.broker == "rabbitmq":
            stack.callback(_rabbitmq_delete, queue)
        app_url = url
        if system.via.startswith("pgbouncer"):
            app_url = stack.enter_context(pgbouncer(admin_url)).url(url)
            if system.via == "pgbouncer-listen":
                options = {**(options or {}), "listen_url": url}
        env = dict(os.environ, PYTHONPATH=python_path(tree), BENCH_REDIS=REDIS_URL,
                   **app_env(system, app_url, queue, options), **(extra_env or {}))
        if tree is not None:
            env["BENCH_DELAYQ_ROOT"] = str(tree)
        if system.inproc:
            env["BENCH_INPROC"] = f"bench:{queue}:inproc"
        ctx = Ctx(system, admin_url, env, url, queue, f"bench:{queue}", logdir, params, tree)
        stack.callback(_cleanup, ctx)
        for install in install_commands(system):
            install = [shutil.which(install[0], path=str(Path(sys.executable).parent))
                       or install[0], *(a.replace("{url}", url or "") for a in install[1:])]
            done = subprocess.run(install, cwd=APPS_DIR, env=env, capture_output=True,
                                  text=True, timeout=300)
            if done.returncode:
                raise RuntimeError(f"{system.name}: {' '.join(install)}:\n{done.stderr[-2000:]}")
        yield ctx


@contextlib.contextmanager
def pgbouncer(admin_url: str) -> Iterator[Any]:
    """A PgBouncer in transaction pooling in front of the server, for one run (the tests'
    own, tests/topology/pgbouncer.py)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from topology.pgbouncer import PgBouncer

    bouncer = PgBouncer(admin_url, mode="transaction").start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


def _cleanup(ctx: Ctx) -> None:
    for proc in ctx.procs:
        proc.kill()
    keys = list(ctx.rc.scan_iter(match=f"{ctx.key}*", count=1000))
    if keys:
        ctx.rc.delete(*keys)


def _rabbitmq_delete(queue: str) -> None:
    from kombu import Connection

    with Connection(AMQP_URL) as conn:
        channel = conn.default_channel
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            channel.queue_delete(name)
        channel.exchange_delete(queue)


# -- workers and producers ------------------------------------------------------------------

WARM_N = 20


def start_worker(ctx: Ctx, layout: tuple[int, int] | None = None, tag: str = "worker"
                 ) -> Proc:
    """The system's worker, ready: its ready line seen (when it has one) and a warm-up of
    no-ops run through it, so every process is connected and warm."""
    cmd, ready, count = worker_command(ctx.system, ctx.queue, layout)
    proc = Proc(cmd, ctx.env, ctx.log(tag))
    ctx.procs.append(proc)
    if ready is not None:
        proc.wait_for_line(ready, count)
    key = ctx.k("warm", uuid.uuid4().hex[:6])
    send(ctx, [job(ctx, "noop", WARM_N, key=key)]).wait(120)
    if wait_done(ctx, key, 120, [proc]) is None:
        raise RuntimeError(f"{ctx.system.name}: the warm-up did not run:\n{proc.tail()}")
    return proc


def job(ctx: Ctx, what: str, n: int, producers: int = 1, **more: Any) -> dict[str, Any]:
    """A producer job (apps/report.py's ``plan``): ``producers`` processes share it."""
    return {"key": more.pop("key", ctx.k(what)), "what": what, "n": n, "producers": producers,
            **more}


class Producers:
    """Producer processes (or, for an in-memory broker, threads of the worker) for ``jobs``,
    one per share of each job; :meth:`go` starts them together."""

    def __init__(self, ctx: Ctx, jobs: list[dict[str, Any]]) -> None:
        self.ctx, self.sync = ctx, ctx.k("sync", uuid.uuid4().hex[:6])
        shares = [{**j, "index": i, "sync": self.sync} for j in jobs
                  for i in range(j["producers"])]
        self.n, self.procs = len(shares), []
        if ctx.system.inproc:
            ctx.rc.rpush(ctx.k("inproc"), *map(_json, shares))
        else:
            self.procs = [subprocess.Popen(producer_command(ctx.system, share), cwd=APPS_DIR,
                                           env=ctx.env) for share in shares]

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def go(self, timeout: float = 180.0) -> Producers:
        deadline = time.monotonic() + timeout
        while int(self.ctx.rc.get(f"{self.sync}:ready") or 0) < self.n:
            if any(p.poll() not in (None, 0) for p in self.procs):
                self.kill()
                raise RuntimeError(f"{self.ctx.system.name}: a producer failed to start")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{self.ctx.system.name}: producers not connected")
            time.sleep(0.01)
        self.ctx.rc.rpush(f"{self.sync}:go", *["go"] * self.n)
        return self

    def wait(self, timeout: float) -> None:
        try:
            codes = [p.wait(timeout=timeout) for p in self.procs]
        finally:
            self.kill()
        if any(codes):
            raise RuntimeError(f"{self.ctx.system.name}: producer exit codes {codes}")

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def send(ctx: Ctx, jobs: list[dict[str, Any]]) -> Producers:
    return Producers(ctx, jobs).go()


def wait_done(ctx: Ctx, key: str, timeout: float, procs: Sequence[Proc] = (),
              progress: Callable[[], None] | None = None) -> float | None:
    """The time the last no-op of ``key`` ran, None if not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = ctx.rc.get(f"{key}:done")
        if done is not None:
            return float(done)
        if any(not p.alive() for p in procs):
            raise RuntimeError(f"{ctx.system.name}: worker died:\n{procs[0].tail()}")
        if progress is not None:
            progress()
        time.sleep(0.02)
    return None


def sends(ctx: Ctx, key: str) -> tuple[float, float]:
    """First and last send of the producers of ``key``."""
    first, ends = ctx.rc.get(f"{key}:sent0"), ctx.rc.lrange(f"{key}:sent_end", 0, -1)
    if first is None or not ends:
        raise RuntimeError(f"{ctx.system.name}: the producers recorded no send")
    return float(first), max(float(e) for e in ends)


# -- figures --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, interpolated between the closest ranks."""
    if len(values) < 2:
        return float(values[0]) if values else math.nan
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 10) - 1]


def lateness(lines: list[bytes], n: int, prefix: str = "") -> dict[str, float]:
    """Of ``timed`` runs: lateness of each ident's first run (start - due) p50/p99/max in ms,
    and how many ran early, twice, or not at all."""
    first: dict[int, float] = {}
    twice = early = 0
    for line in lines:
        ident_s, start_s, due_s = line.decode().split()
        ident, late = int(ident_s), (float(start_s) - float(due_s)) * 1000
        early += late < 0
        if ident in first:
            twice += 1
            first[ident] = min(first[ident], late)
        else:
            first[ident] = late
    late_ms = sorted(first.values())
    out = {"lost": n - len(first), "twice": twice, "early": early}
    if late_ms:
        out |= {"p50_ms": percentile(late_ms, 50), "p99_ms": percentile(late_ms, 99),
                "max_ms": late_ms[-1]}
    return {prefix + k: round(v, 2) for k, v in out.items()}


class BackendCpu:
    """CPU seconds of one database's backends over a phase, sampled every 0.25 s so that
    sessions ending before the phase does (producers') count up to their last sample."""

    def __init__(self, admin_url: str, url: str) -> None:
        self.conn = psycopg.connect(admin_url, autocommit=True)
        self.dbname = urlsplit(url).path.lstrip("/")
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.procs: dict[int, psutil.Process] = {}
        self._sample(initial=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, initial: bool = False) -> None:
        for (pid,) in self.conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s"
                                        " AND pid <> pg_backend_pid()", [self.dbname]):
            try:
                proc = self.procs.setdefault(pid, psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
            used = cpu_seconds(proc)
            self.first.setdefault(pid, used if initial else 0.0)
            if used:
                self.last[pid] = used

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._sample()

    def used(self) -> float:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        self.conn.close()
        return sum(self.last.get(pid, start) - start for pid, start in self.first.items())


def server_cpu(system: System, admin_url: str, url: str | None) -> Callable[[], float]:
    """A meter of the broker server's CPU seconds from now: this database's backends,
    ``redis-server`` or RabbitMQ's ``beam.smp``; returns its reading function."""
    if url is not None:
        return BackendCpu(admin_url, url).used
    name = {"redis": "redis-server", "rabbitmq": "beam.smp"}.get(system.broker)
    procs = [p for p in psutil.process_iter(["name"]) if name and p.info["name"] == name]
    start = sum(cpu_seconds(p) for p in procs)
    return lambda: sum(cpu_seconds(p) for p in procs) - start


class NotifyMeter:
    """delayq's NOTIFYs on its table's channel, counted by a LISTEN of the harness' own."""

    def __init__(self, url: str) -> None:
        from delayq_transport.core.db.queries import notify_channel

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(notify_channel(TABLE))))
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.count += sum(1 for _ in self.conn.notifies(timeout=0.1))

    def close(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        self.conn.close()
        return self.count
