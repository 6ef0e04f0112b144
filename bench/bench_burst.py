"""Countdowns in a burst, the peers side by side, many workers on one queue (issue 41).

Every system runs the jobs of ``bench/burst_app.py`` in real worker processes, each job
reporting to Redis with one round trip; each phase gets a fresh PostgreSQL database and fresh
worker processes, and starts after a CHECKPOINT. Lateness is the job's own start
(``time.time()`` in the job) minus the due time the message carries (Celery's eta, Dramatiq's
``options["eta"]``, PgQueuer's ``execute_after``, Procrastinate's ``scheduled_at``). Modes:

- ``burst``: countdowns published as fast as possible, delays uniform over the span
  (``--sizes 2000/20,20000/60``), from 1 and 4 producer processes (``--producers``), through
  Celery (one worker ``prefork -c 4``) and Dramatiq (one worker process × 4 threads) on delayq;
  beside them the spaced case: one producer publishing every ``--spacing-ms`` (20 ms) for the
  span. Reported: lateness p50/p99/max, and how many ran early (before their eta), twice, or
  not at all (lost: not run by the last send + span + ``--grace``);
- ``peers``: PgQueuer 1.6 and Procrastinate 3.10 at their documented defaults (one worker,
  concurrency 4, an async no-op job; see ``PEER_NOTES``) beside delayq's Celery and Dramatiq
  rows: a drain of ``--drain-n`` no-ops end to end (one producer enqueuing one job per call,
  synchronous API, and the peers' async API), the burst of the first size, and one process
  COPYing the same rows into the system's table (the insert limit);
- ``many``: 20 consumer processes on one queue (one Dramatiq worker ``-p 20 -t 1``) and 4
  producers: a countdown burst (lateness) and a drain (end to end), with the NOTIFYs counted
  (a LISTEN of the harness' own), ``pg_notification_queue_usage()`` sampled, and the CPU of
  the database's backends, of PostgreSQL's WAL writer/checkpointer/bgwriter, and of the
  workers. Run it with ``--window-ms 0 --window-ms 5`` (or ``--variant``s: see below).

Rounds (``--rounds``, default 3) interleave the systems and variants, the order rotating each
round; each figure is the median of the rounds with their min-max. Variants of delayq:
``--rev REV`` (another revision's library, exported with ``git archive``, bench/_variants.py)
and ``--window-ms MS`` (the wake-up window ``DEFAULT_WINDOW_S`` of core/queue/announce.py set to MS,
in this checkout's library and in each ``--rev``'s), or exactly the variants named with
``--variant`` (``.`` or a revision, optionally ``~window_ms=MS``). A run with a variant in
``burst`` or ``peers`` mode is an A/B: its results go to ``bench/results/<mode>_ab.json``,
never to the docs.
Otherwise ``bench/results/{burst,peers,many_workers}.json`` and their sections of
docs/benchmarks.md (written by ``_burst_report.py``; ``render_docs.py`` rewrites them).

Diagnostics (environment, never in a recorded run): ``BURST_TRACE=1`` writes every run, the
Celery worker's receipt of each countdown (its main process, before the pool) and every garbage
collection over 5 ms (process, generation) to ``trace-<key>.txt`` in the log folder: lateness
split into the queue's part and the pool's. ``BURST_PRODUCER_NICE=N`` runs the producers at
that niceness (how much of a tail is the producers' CPU on a small machine).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import click
import psutil
import psycopg
import redis
from _burst_report import (
    DELAYQ_SYSTEMS,
    MODES,
    OPT_IN,
    PEERS,
    RESULT_NAMES,
    SYSTEMS,
    section,
)
from _celery_cpu import ServerCpu
from _common import (
    BENCH_DIR,
    REPO_ROOT,
    TABLE,
    checkpoint,
    command_line,
    console,
    cpu_seconds,
    database_url_option,
    fresh_database,
    git_revision,
    handle_stop_signals,
    load_results,
    machine_info,
    percentile,
    progress_bar,
    tree_cpu,
    wait_for_log,
    write_results,
)
from _targets import replace_section
from _variants import source_tree, tree_env, window_tree
from psycopg import sql
from psycopg.types.json import Jsonb

#: The queue table of each system (the COPY's target).
TABLES = {"celery": TABLE, "dramatiq": TABLE, "pgqueuer": "pgqueuer",
          "procrastinate": "procrastinate_jobs"}
#: A column made unique per copied row (delayq's key); the others copy one row as it is.
COPY_VARY = {"celery": "pKey", "dramatiq": "pKey"}
RELAXED = "-c synchronous_commit=off"
CELERY_FLAGS = ("--loglevel=WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat")
CELERY_READY = "bench: worker ready"  # celery_bench_app.READY_LINE
PEER_READY = "burst: worker ready"  # burst_app.READY_LINE
#: The many-workers layout: Dramatiq, 20 processes × 1 thread (see the module docstring of
#: the section: one `dramatiq` command forks them; Celery would need 20 main processes and
#: 20 pool children for the same 20 consumers).
MANY_PROCESSES = 20
WARM_N = 20


# -- what runs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """delayq's library: this checkout's, another revision's, and/or another wake-up window."""

    rev: str | None = None
    window_ms: float | None = None

    @property
    def label(self) -> str:
        parts = [f"@{self.rev}" if self.rev else "", "" if self.window_ms is None
                 else f"window {self.window_ms:g} ms"]
        return " ".join(p for p in parts if p) or "this checkout"

    def tree(self) -> Path | None:
        if self.window_ms is not None:
            return window_tree(self.rev, self.window_ms)
        return source_tree(self.rev) if self.rev else None


@dataclass(frozen=True)
class Case:
    """One measurement: ``burst``/``spaced`` countdowns, a ``drain`` of no-ops, a ``copy``."""

    kind: str
    n: int
    span_s: float = 0.0
    producers: int = 1
    spacing_s: float = 0.0
    api: str = "sync"

    @property
    def key(self) -> str:
        if self.kind in ("burst", "spaced"):
            every = f", every {self.spacing_s * 1000:g} ms" if self.spacing_s else ""
            return (f"{self.kind} {self.n}/{self.span_s:g}s, {self.producers} "
                    f"producer{'s' if self.producers > 1 else ''}{every}")
        if self.kind == "drain":
            return f"drain {self.n}, {self.api} API, {self.producers} producer" + (
                "s" if self.producers > 1 else "")
        return f"copy {self.n}"


@dataclass
class Settings:
    admin_url: str
    counter_url: str
    rounds: int
    grace_s: float
    seed: int
    drain_limit_s: float
    layout: tuple[int, int]  # worker processes, threads (concurrency) each
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    logdir: Path = field(default_factory=lambda: Path(
        os.environ.get("TMPDIR", "/tmp")) / f"bench_burst_{uuid.uuid4().hex[:6]}")


def base_of(system: str) -> str:
    return system.split("_")[0]


# -- state and processes --------------------------------------------------------------------


@dataclass
class Run:
    system: str
    variant: Variant
    env: dict[str, str]
    url: str

    @property
    def key(self) -> str:
        return self.env["BURST_KEY"]


def _relaxed(url: str) -> str:
    return url + ("&" if "?" in url else "?") + "options=" + quote(RELAXED)


@contextmanager
def system_state(system: str, variant: Variant, cfg: Settings) -> Iterator[Run]:
    """A fresh database for one phase, the peer's schema installed, the env of its processes."""
    base = base_of(system)
    queue = f"burst_{cfg.run_id}"
    with fresh_database(cfg.admin_url, prefix=f"delayq_bench_burst_{base}") as url:
        own = _relaxed(url) if system.endswith("_relaxed") else url
        env = dict(os.environ, BURST_SYSTEM=base, BURST_URL=own, BURST_QUEUE=queue,
                   BURST_COUNTER=cfg.counter_url,
                   BURST_KEY=f"burst:{cfg.run_id}:{uuid.uuid4().hex[:8]}",
                   BURST_PEER_OPTION="limit4" if system.endswith("_limit4") else "",
                   BURST_PEER_DRIVER="asyncpg" if system.endswith("_asyncpg") else "",
                   BENCH_TRANSPORT_OPTIONS="{}",
                   PYTHONPATH=os.pathsep.join([str(BENCH_DIR), str(REPO_ROOT),
                                               os.environ.get("PYTHONPATH", "")]))
        if base == "celery":
            env.update(BENCH_BROKER_URL="delayq+postgresql://" + url.split("://", 1)[1],
                       BENCH_QUEUE=queue, BENCH_COUNTER_URL=cfg.counter_url,
                       BENCH_PREFETCH="4", BENCH_ACKS_LATE="0")
        tree = variant.tree()
        if tree is not None:
            env = tree_env(env, tree)
        if system in PEERS:
            subprocess.run([sys.executable, "-c", "import burst_app; burst_app.install()"],
                           cwd=BENCH_DIR, env=env, check=True, capture_output=True)
        yield Run(system, variant, env, url)


class Proc:
    """A worker process in its own process group, killed with its children."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, ready: str,
                 count: int = 1) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_path, self.ready, self.count = log, ready, count
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(cmd, cwd=BENCH_DIR, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 120.0) -> None:
        wait_for_log(self.proc, self.log_path, self.ready, self.count, timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self._log.close()


@contextmanager
def workers(run: Run, cfg: Settings, tag: str) -> Iterator[list[Proc]]:
    """The system's worker(s) for one phase: ``cfg.layout`` processes × threads."""
    processes, threads = cfg.layout
    base, log = base_of(run.system), cfg.logdir / f"{tag}-{run.system}"
    py = sys.executable
    if base == "celery":
        node = f"burst-{uuid.uuid4().hex[:6]}"
        procs = [Proc([py, "-m", "celery", "-A", "burst_app", "worker", "-P", "prefork",
                       "-c", str(threads), *CELERY_FLAGS, "-n", f"{node}-{i}@%h",
                       "-Q", run.env["BURST_QUEUE"]], run.env, Path(f"{log}-{i}.log"),
                      CELERY_READY) for i in range(processes)]
    elif base == "dramatiq":
        procs = [Proc([py, "-m", "dramatiq", "burst_app", "-p", str(processes), "-t",
                       str(threads), "--queues", run.env["BURST_QUEUE"]], run.env,
                      Path(f"{log}.log"), "ready for action", processes)]
    elif base == "pgqueuer":
        procs = [Proc([py, "-c", "import burst_app; burst_app.run_pgqueuer()"], run.env,
                      Path(f"{log}-{i}.log"), PEER_READY) for i in range(processes)]
    else:
        procs = [Proc([py, "-c", f"import burst_app; burst_app.run_procrastinate({threads})"],
                      run.env, Path(f"{log}-{i}.log"), PEER_READY) for i in range(processes)]
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.kill()


def counter(cfg: Settings) -> redis.Redis:
    return redis.Redis.from_url(cfg.counter_url)


class Producers:
    """Producer processes that connect, then start together on the harness' go."""

    def __init__(self, run: Run, cfg: Settings, key: str, producers: int,
                 **job: Any) -> None:
        self.key, self.n, self.client = key, producers, counter(cfg)
        code = ("import json, sys, burst_app\n"
                "burst_app.produce(**json.loads(sys.argv[1]))\n")
        self.procs = [subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(
                {"key": key, "index": i, "producers": producers, **job})],
            cwd=BENCH_DIR, env=run.env) for i in range(producers)]

    def go(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while int(self.client.get(f"{self.key}:ready") or 0) < self.n:
            if any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError("a producer failed before the start")
            if time.monotonic() > deadline:
                raise TimeoutError("producers not connected in time")
            time.sleep(0.02)
        self.client.rpush(f"{self.key}:go", *["go"] * self.n)

    def wait(self, timeout: float) -> None:
        codes = [p.wait(timeout=timeout) for p in self.procs]
        if any(codes):
            raise RuntimeError(f"producer exit codes {codes}")

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def send(run: Run, cfg: Settings, key: str, producers: int, timeout: float, **job: Any
         ) -> Producers:
    """Start producers and let them go; the caller waits for them."""
    prods = Producers(run, cfg, key, producers, **job)
    try:
        prods.go()
    except BaseException:
        prods.kill()
        raise
    return prods


def wait_done(cfg: Settings, key: str, timeout: float) -> float | None:
    client, deadline = counter(cfg), time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = client.get(f"{key}:done")
        if done is not None:
            return float(done)
        time.sleep(0.02)
    return None


def warm_up(run: Run, cfg: Settings, procs: list[Proc]) -> int | None:
    """A few no-ops through the running worker(s), so every process is connected and warm.
    A system that has run some but not all of them after a minute (PgQueuer with
    ``concurrency_limit=4`` ran a few jobs/s here) is measured anyway: returns how many ran
    then (None: all), which the round records; none at all is an error."""
    key = f"{run.key}:warm"
    send(run, cfg, key, 1, 120, what="noop", n=WARM_N).wait(120)
    client, deadline = counter(cfg), time.monotonic() + 60
    while wait_done(cfg, key, 0.5) is None:
        dead = [p for p in procs if p.proc.poll() is not None]
        ran = int(client.get(key) or 0)
        if dead or (time.monotonic() > deadline and not ran):
            tail = (dead or procs)[0].log_path.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"the warm-up no-ops did not run:\n{tail}")
        if time.monotonic() > deadline:
            return ran
    return None


def _sends(client: redis.Redis, key: str) -> tuple[float, float]:
    first = client.get(f"{key}:sent0")
    ends = client.lrange(f"{key}:sent_end", 0, -1)
    if first is None or not ends:
        raise RuntimeError("the producers recorded no send")
    return float(first), max(float(e) for e in ends)


# -- measurements ---------------------------------------------------------------------------


def lateness(lines: list[bytes], n: int) -> dict[str, Any]:
    """Lateness of each countdown's first run, and what ran early, twice or never."""
    first: dict[int, tuple[float, float]] = {}
    twice = early = no_eta = 0
    for line in lines:
        ident_s, start_s, eta_s = line.decode().split()
        ident, start, eta = int(ident_s), float(start_s), float(eta_s)
        if math.isnan(eta):
            no_eta += 1
        elif start < eta:
            early += 1
        if ident in first:
            twice += 1
            first[ident] = min(first[ident], (start, eta))
        else:
            first[ident] = (start, eta)
    late = sorted((s - e) * 1000 for s, e in first.values() if not math.isnan(e))
    out: dict[str, Any] = {"n": n, "ran": len(first), "lost": n - len(first), "twice": twice,
                           "early": early, "no_eta": no_eta}
    if late:
        out |= {"p50_ms": round(percentile(late, 50) or 0.0, 2),
                "p99_ms": round(percentile(late, 99) or 0.0, 2),
                "max_ms": round(late[-1], 2), "min_ms": round(late[0], 2)}
    return out


def measure_burst(run: Run, case: Case, cfg: Settings, progress: Any) -> dict[str, Any]:
    """Publish the case's countdowns, wait for them (or the deadline), count lateness."""
    client = counter(cfg)
    prods = send(run, cfg, run.key, case.producers, 900, what="burst", n=case.n,
                 span_s=case.span_s, seed=cfg.seed, spacing_s=case.spacing_s, api=case.api)
    bar = progress.add_task(f"{run.system} {run.variant.label}: {case.key}", total=case.n,
                            rate="", unit="runs")
    try:
        prods.wait(timeout=case.span_s + 900)
    finally:
        prods.kill()
    first, last = _sends(client, run.key)
    deadline = last + case.span_s + cfg.grace_s
    runs_key = f"{run.key}:runs"
    while time.time() < deadline:
        seen = int(client.llen(runs_key))
        progress.update(bar, completed=seen)
        if seen >= case.n:
            time.sleep(min(2.0, max(0.0, deadline - time.time())))  # a late duplicate
            break
        time.sleep(0.1)
    out = lateness(client.lrange(runs_key, 0, -1), case.n)
    if os.environ.get("BURST_TRACE"):  # diagnostics: every run and receipt, for a look after
        trace = cfg.logdir / f"trace-{run.key}.txt"
        trace.write_bytes(b"\n".join([b"runs", *client.lrange(runs_key, 0, -1), b"recv",
                                       *client.lrange(f"{run.key}:recv", 0, -1), b"gc",
                                       *client.lrange(f"{run.key}:gc", 0, -1)]))
    out["publish_s"] = round(last - first, 3)
    return out


def measure_drain(run: Run, case: Case, cfg: Settings, progress: Any) -> dict[str, Any]:
    """No-ops sent one per call while the worker runs: first send to last run. A system that
    has not run them all after ``cfg.drain_limit_s`` is stopped there and its rate is what ran
    in that time (``partial``): a peer at a few jobs/s would otherwise take hours."""
    key = f"{run.key}:drain"
    bar = progress.add_task(f"{run.system} {run.variant.label}: {case.key}", total=case.n,
                            rate="", unit="jobs")
    prods = send(run, cfg, key, case.producers, 900, what="noop", n=case.n, api=case.api)
    went = time.time()
    client = counter(cfg)
    try:
        deadline = time.monotonic() + cfg.drain_limit_s
        while time.monotonic() < deadline and client.get(f"{key}:done") is None:
            progress.update(bar, completed=int(client.get(key) or 0))
            time.sleep(0.1)
        done = client.get(f"{key}:done")
        if done is None:
            ran, elapsed = int(client.get(key) or 0), time.time() - went
            if not ran:
                return {"error": f"nothing ran in {cfg.drain_limit_s:g} s"}
            return {"n": case.n, "ran": ran, "partial": True, "seconds": round(elapsed, 3),
                    "jobs_per_s": round(ran / elapsed, 1)}
        prods.wait(timeout=60)
    finally:
        prods.kill()
    first, last = _sends(client, key)
    return {"n": case.n, "jobs_per_s": round(case.n / (float(done) - first), 1),
            "sends_per_s": round(case.n / (last - first), 1),
            "seconds": round(float(done) - first, 3)}


def measure_copy(run: Run, case: Case, cfg: Settings) -> dict[str, Any]:
    """One process COPYing ``n`` rows shaped like the one a producer just enqueued (no worker
    runs) into the system's table, at the system's durability: the insert limit."""
    key = f"{run.key}:copy"
    send(run, cfg, key, 1, 120, what="noop", n=1).wait(120)
    table = TABLES[base_of(run.system)]
    relaxed = run.system in DELAYQ_SYSTEMS or run.system.endswith("_relaxed")
    with psycopg.connect(run.url, autocommit=True) as conn:
        cols = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
            " AND table_schema = current_schema() AND is_identity = 'NO'"
            " AND coalesce(column_default, '') NOT LIKE 'nextval(%%'"
            " ORDER BY ordinal_position", [table])]
        ident = sql.SQL(", ").join(map(sql.Identifier, cols))
        row = conn.execute(sql.SQL("SELECT {} FROM {} LIMIT 1").format(
            ident, sql.Identifier(table))).fetchone()
        if row is None:
            return {"error": f"no row in {table} to copy"}
        vary = cols.index(COPY_VARY[run.system]) if run.system in COPY_VARY else None
        if relaxed:
            conn.execute("SET synchronous_commit = off")
        row = tuple(Jsonb(v) if isinstance(v, dict | list) else v for v in row)
        rows = [list(row) for _ in range(case.n)]
        if vary is not None:
            for i, r in enumerate(rows):
                r[vary] = f"{row[vary]}-{i}"
        start = time.perf_counter()
        with conn.transaction(), conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                sql.Identifier(table), ident)) as copy:
            for r in rows:
                copy.write_row(r)
        seconds = time.perf_counter() - start
    return {"n": case.n, "rows_per_s": round(case.n / seconds, 1),
            "synchronous_commit": "off" if relaxed else "on"}


class NotifyMeter:
    """delayq's NOTIFYs on one table's channel, counted by a LISTEN of the harness' own (every
    listener gets each one once), and ``pg_notification_queue_usage()`` sampled meanwhile."""

    def __init__(self, url: str) -> None:
        from delayq_transport.core.db.queries import notify_channel

        self.channel = notify_channel(TABLE)
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        self.sampler = psycopg.connect(url, autocommit=True)
        self.notifications = self.payload_bytes = 0
        self.queue_usage_max = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_sample = 0.0
        while not self._stop.is_set():
            for note in self.conn.notifies(timeout=0.1):
                self.notifications += 1
                self.payload_bytes += len(note.payload)
            if time.monotonic() >= next_sample:
                row = self.sampler.execute("SELECT pg_notification_queue_usage()").fetchone()
                self.queue_usage_max = max(self.queue_usage_max, float(row[0]) if row else 0.0)
                next_sample = time.monotonic() + 0.2

    def close(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=5)
        self.conn.close()
        self.sampler.close()
        return {"notifications": self.notifications, "payload_bytes": self.payload_bytes,
                "queue_usage_max": self.queue_usage_max}


class BackendCpu:
    """CPU seconds of one database's backends over a phase, sampled every 0.25 s so that the
    producers' sessions, which end before the phase does, are counted too (up to their last
    sample); a backend that started meanwhile counts from zero."""

    def __init__(self, admin_url: str, dbname: str) -> None:
        self.conn = psycopg.connect(admin_url, autocommit=True)
        self.dbname = dbname
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._sample(initial=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, initial: bool = False) -> None:
        rows = self.conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                 [self.dbname]).fetchall()
        for (pid,) in rows:
            proc = self._procs.get(pid)
            if proc is None:
                try:
                    proc = self._procs[pid] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    continue
            used = cpu_seconds(proc)
            if pid not in self.first:
                self.first[pid] = used if initial else 0.0
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


def listeners(admin_url: str, dbname: str) -> int:
    """Backends of this database LISTENing now (the workers' wake-up connections)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                           " AND query ILIKE 'LISTEN%%'", [dbname]).fetchone()
    return int(row[0]) if row else 0


def run_one(system: str, variant: Variant, case: Case, cfg: Settings, progress: Any,
            mode: str) -> dict[str, Any]:
    """One case for one system and variant: fresh database, fresh workers."""
    with system_state(system, variant, cfg) as run:
        if case.kind == "copy":
            return measure_copy(run, case, cfg)
        with workers(run, cfg, case.kind) as procs:
            warm = warm_up(run, cfg, procs)
            meters = None
            if mode == "many":
                dbname = run.url.rsplit("/", 1)[1]
                ns = SimpleNamespace(db_url=run.url, name=system)
                # The workers' LISTENs, counted before the harness' own starts.
                listening = listeners(cfg.admin_url, dbname)
                meters = (BackendCpu(cfg.admin_url, dbname),
                          ServerCpu(ns, cfg.admin_url, aux=True),
                          tree_cpu(p.proc.pid for p in procs), NotifyMeter(run.url),
                          time.monotonic(), listening)
            if case.kind == "drain":
                out = measure_drain(run, case, cfg, progress)
            else:
                out = measure_burst(run, case, cfg, progress)
            if warm is not None:
                out["warm_up_ran"] = f"{warm}/{WARM_N} after 60 s"
            if meters is not None:
                backends, aux, workers_cpu0, notes, t0, listening = meters
                seconds = time.monotonic() - t0
                out |= notes.close()
                out |= {"seconds_metered": round(seconds, 2), "listeners": listening,
                        "pg_backends_cpu_s": round(backends.used(), 3),
                        "pg_aux_cpu_s": round(aux.used(), 3),
                        "workers_cpu_s": round(tree_cpu(p.proc.pid for p in procs)
                                               - workers_cpu0, 3),
                        "notifications_per_s": round(out["notifications"] / seconds, 1)}
        return out


# -- the plan and its summary ----------------------------------------------------------------


def cases_for(mode: str, sizes: list[tuple[int, float]], producers: list[int],
              spacing_ms: float, drain_n: int) -> list[Case]:
    first_n, first_span = sizes[0]
    if mode == "burst":
        cases = [Case("burst", n, span, p) for n, span in sizes for p in producers]
        cases += [Case("spaced", int(span * 1000 / spacing_ms), span, 1, spacing_ms / 1000)
                  for _, span in sizes]
        return cases
    if mode == "peers":
        return [Case("drain", drain_n), Case("drain", drain_n, api="async"),
                Case("burst", first_n, first_span), Case("copy", drain_n)]
    return [Case("burst", first_n, first_span, 4), Case("drain", drain_n, producers=4)]


def applies(system: str, variant: Variant, case: Case, first: Variant) -> bool:
    """Peers run once a round (with the first variant: theirs is no delayq); delayq has no
    async producer API."""
    if system in PEERS:
        return variant == first
    return not (case.kind == "drain" and case.api == "async")


#: The figures summarised per case: median, min and max over the rounds.
FIGURES = ("p50_ms", "p99_ms", "max_ms", "early", "twice", "lost", "publish_s", "jobs_per_s",
           "sends_per_s", "rows_per_s", "notifications", "notifications_per_s",
           "queue_usage_max", "pg_backends_cpu_s", "pg_aux_cpu_s", "workers_cpu_s",
           "listeners")


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max of every figure over the rounds that have it."""
    ok = [r for r in rounds if "error" not in r]
    out: dict[str, Any] = {"rounds": rounds, "ok_rounds": len(ok)}
    for name in FIGURES:
        values = [r[name] for r in ok if r.get(name) is not None]
        if values:
            out[name] = {"median": statistics.median(values), "min": min(values),
                         "max": max(values)}
    partial = [r for r in ok if r.get("partial")]
    if partial:  # drains stopped at the time limit: what ran of how many, in how long
        out["partial"] = [f"{r['ran']:,}/{r['n']:,} in {r['seconds']:,.0f} s" for r in partial]
    short = [r["warm_up_ran"] for r in ok if r.get("warm_up_ran")]
    if short:  # measured after a warm-up that did not finish: the section says so
        out["warm_up_short"] = short
    errors = [r["error"] for r in rounds if "error" in r]
    if errors:
        out["errors"] = errors
    return out


def run_all(mode: str, systems: list[str], variants: list[Variant], cases: list[Case],
            cfg: Settings) -> dict[str, dict[str, Any]]:
    entries = [(s, v) for s in systems for v in variants]
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with progress_bar() as progress:
        total = sum(applies(s, v, c, variants[0]) for c in cases for s, v in entries) * cfg.rounds
        overall = progress.add_task("phases", total=total, rate="", unit="runs")
        for rnd in range(cfg.rounds):
            for case in cases:
                shift = rnd % len(entries)
                for system, variant in entries[shift:] + entries[:shift]:
                    if not applies(system, variant, case, variants[0]):
                        continue
                    checkpoint(cfg.admin_url)
                    label = entry_label(system, variant)
                    try:
                        outcome = run_one(system, variant, case, cfg, progress, mode)
                    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
                        console.print(f"[red]{label} / {case.key} failed: {exc!r}")
                        outcome = {"error": repr(exc)}
                    raw.setdefault(case.key, {}).setdefault(label, []).append(outcome)
                    progress.advance(overall)
    return {case: {label: summarize(rounds) for label, rounds in by.items()}
            for case, by in raw.items()}


def entry_label(system: str, variant: Variant) -> str:
    if variant == Variant() or system in PEERS:
        return system
    return f"{system} {variant.label}"


# -- the command -----------------------------------------------------------------------------


def _sizes(value: str) -> list[tuple[int, float]]:
    try:
        out = [(int(n), float(span)) for n, span in
               (item.strip().rstrip("s").split("/") for item in value.split(",") if item.strip())]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected N/SECONDS[,N/SECONDS]",
                                 param_hint="--sizes") from None
    if not out or any(n < 1 or span <= 0 for n, span in out):
        raise click.BadParameter(f"{value!r}: sizes and spans must be positive",
                                 param_hint="--sizes")
    return out


def _variant(spec: str) -> Variant:
    """``REV`` or ``.`` (this checkout), optionally ``~window_ms=MS``."""
    rev, _, option = spec.partition("~")
    window: float | None = None
    if option:
        name, _, value = option.partition("=")
        try:
            window = float(value)
        except ValueError:
            window = -1.0
        if name != "window_ms" or window < 0:
            raise click.BadParameter(f"{spec!r}: the one option is ~window_ms=MS (MS ≥ 0)",
                                     param_hint="--variant")
    if not rev:
        raise click.BadParameter(f"{spec!r}: name a revision, or `.` for this checkout",
                                 param_hint="--variant")
    return Variant(None if rev == "." else rev, window)


def _ints(value: str, flag: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected integers", param_hint=flag) from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: expected positive integers", param_hint=flag)
    return out


@click.command()
@click.option("--mode", type=click.Choice(MODES), default="burst", show_default=True,
              help="burst: lateness of countdown bursts (and the spaced case); peers: "
                   "PgQueuer and Procrastinate beside delayq; many: 20 consumer processes.")
@database_url_option
@click.option("--systems", default="",
              help=f"Comma-separated, of {', '.join(SYSTEMS)} (default: celery,dramatiq for "
                   "burst, all for peers, dramatiq for many).")
@click.option("--sizes", default="2000/20,20000/60", show_default=True,
              help="Countdowns/span in seconds of each burst (peers and many: the first).")
@click.option("--producers", "producers_opt", default="1,4", show_default=True,
              help="Producer processes of the burst cases (burst mode).")
@click.option("--spacing-ms", default=20.0, show_default=True,
              help="Between two publishes of the spaced case.")
@click.option("--drain-n", default=10_000, show_default=True, help="No-ops of a drain.")
@click.option("--rounds", default=3, show_default=True, help="Interleaved rounds.")
@click.option("--drain-limit", "drain_limit_s", default=180.0, show_default=True,
              help="Seconds a drain may take; a slower system's rate is what ran by then.")
@click.option("--grace", "grace_s", default=60.0, show_default=True,
              help="Seconds after the last eta before a countdown not run counts as lost.")
@click.option("--rev", "revs", multiple=True,
              help="Also run delayq from this git revision (repeatable; an A/B).")
@click.option("--window-ms", "windows", multiple=True, type=float,
              help="Run delayq with DEFAULT_WINDOW_S set to this (repeatable; applies to "
                   "this checkout and every --rev).")
@click.option("--variant", "specs", multiple=True,
              help="Exactly these delayq variants instead (repeatable): REV, or `.` for this "
                   "checkout, with an optional ~window_ms=MS: `--variant . --variant "
                   "c73efa0~window_ms=0 --variant c73efa0~window_ms=5`.")
@click.option("--seed", default=41, show_default=True, help="Of the delays.")
@click.option("--counter-db", default=13, show_default=True, help="Redis db of the reports.")
@click.option("--no-write", is_flag=True, help="Only print: no results file, no docs.")
def main(mode: str, database_url: str, systems: str, sizes: str, producers_opt: str,
         spacing_ms: float, drain_n: int, drain_limit_s: float, rounds: int, grace_s: float,
         revs: tuple[str, ...], windows: tuple[float, ...], specs: tuple[str, ...], seed: int,
         counter_db: int, no_write: bool) -> None:
    """Countdown bursts, the PostgreSQL-native peers, and many workers (issue 41)."""
    default = {"burst": "celery,dramatiq", "many": "dramatiq",
               "peers": ",".join(s for s in SYSTEMS if s not in OPT_IN)}
    chosen = [s.strip() for s in (systems or default[mode]).split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SYSTEMS]
    if unknown:
        raise click.BadParameter(f"unknown {unknown}; choose from {SYSTEMS}",
                                 param_hint="--systems")
    if mode == "many" and chosen != ["dramatiq"]:
        raise click.BadParameter("many runs Dramatiq only (20 processes × 1 thread)",
                                 param_hint="--systems")
    if spacing_ms <= 0 or drain_n < 1 or rounds < 1 or grace_s < 0 or drain_limit_s <= 0:
        raise click.BadParameter("--spacing-ms, --drain-n, --drain-limit, --rounds must be "
                                 "positive, --grace not negative")
    if any(w < 0 for w in windows):
        raise click.BadParameter("a window cannot be negative", param_hint="--window-ms")
    if specs and (revs or windows):
        raise click.BadParameter("either --variant or --rev/--window-ms", param_hint="--variant")
    variants = ([_variant(spec) for spec in specs] if specs else
                [Variant(rev, w) for rev in (None, *revs) for w in (windows or (None,))])
    for v in variants:
        try:  # fail now, not mid-run: a revision that is not there, a window line gone
            v.tree()
        except (ValueError, subprocess.CalledProcessError) as exc:
            why = str(getattr(exc, "stderr", None) or exc).strip()
            raise click.BadParameter(f"{v.label}: {why}",
                                     param_hint="--rev/--window-ms/--variant") from None
    handle_stop_signals()
    cfg = Settings(admin_url=database_url, counter_url=f"redis://127.0.0.1:6379/{counter_db}",
                   rounds=rounds, grace_s=grace_s, seed=seed, drain_limit_s=drain_limit_s,
                   layout=(MANY_PROCESSES, 1) if mode == "many" else (1, 4))
    cases = cases_for(mode, _sizes(sizes), _ints(producers_opt, "--producers"), spacing_ms,
                      drain_n)
    info = machine_info(database_url)
    console.print(f"run {cfg.run_id}: worker logs in {cfg.logdir}")
    try:
        results = run_all(mode, chosen, variants, cases, cfg)
    finally:
        client = counter(cfg)
        keys = list(client.scan_iter(match=f"burst:{cfg.run_id}:*", count=1000))
        if keys:
            client.delete(*keys)
    info["load_average_at_end"] = list(os.getloadavg())
    settings = {"mode": mode, "systems": chosen, "variants": [v.label for v in variants],
                "sizes": sizes, "producers": producers_opt, "spacing_ms": spacing_ms,
                "drain_n": drain_n, "drain_limit_s": drain_limit_s, "rounds": rounds,
                "grace_s": grace_s, "seed": seed,
                "layout": list(cfg.layout)}
    data = {"mode": mode, "command": command_line(), "revision": git_revision(),
            "machine": info, "settings": settings, "results": results}
    click.echo(section({**data, "finished_at": None}))
    if no_write:
        return
    ab = mode != "many" and variants != [Variant()]
    name = RESULT_NAMES[mode] + ("_ab" if ab else "")
    path = write_results(name, data)
    console.print(f"results: {path}")
    if not ab:
        console.print(f"docs: {replace_section(name, section(load_results(name)))}")


if __name__ == "__main__":
    main()
