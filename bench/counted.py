"""Counted work per task: what each operation of the hot path costs the database, counted.

Timings on a shared 2-core machine resolve about +-10 % (issue 43); counts do not move. This
starts a throwaway PostgreSQL 15 cluster (``initdb`` in a temporary folder, a free port,
``pg_stat_statements`` preloaded, autovacuum off, ``full_page_writes`` off so the WAL of an
operation does not depend on when the last checkpoint was), migrates delayq's schema there and
runs each operation through delayq's public API (the queue, the consumer session every front end
stands on, the beat installer, the django.tasks backend and worker) over ``n`` tasks. Per task:

* ``statements``: statements the server executed (``pg_stat_statements`` calls, transaction
  control included), also by the name of delayq's statement (``by_statement``);
* ``round_trips``: times a client sent and then waited for the server, counted by a relay in
  front of the cluster that reads the protocol (connection start-up and termination left out;
  ``connections`` counts the connections opened);
* ``rows``: rows the statements returned or changed (``pg_stat_statements`` rows);
* ``buffers``: shared buffers the statements touched (hit, read, dirtied): the rows and index
  pages read, the figure that grows when a poll walks rows it does not take;
* ``wal_bytes``: WAL written (``pg_current_wal_insert_lsn`` before and after).

The same input gives the same figures: each operation runs on connections opened and warmed
before it is measured, and the timers that would add statements at run-dependent moments are
set past the run (the announcer's window, the session's ack interval; acks flush every
``batch_size``, as on a busy worker). The django.tasks worker runs its own timers and threads;
its figures carry a tolerance (``bench/budgets.json``).

    python3 bench/counted.py --spark         # 1,000 tasks each: bench/results/counted.json
    python3 bench/counted.py --check         # 300 each, as the suite: compare with the budgets
    python3 bench/counted.py --budgets       # 300 each: rewrite bench/budgets.json
    python3 bench/counted.py --drain 5000000 # issue 43: a Celery drain of 5,000 no-ops

tests/integration/test_counted_work.py runs it and fails when a figure exceeds its budget.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
BUDGETS = BENCH_DIR / "budgets.json"
PG_BIN = Path(os.environ.get("DELAYQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
PY312 = Path.home() / ".cache/delayq/venv-py312/bin/python"
#: Tasks per operation: the suite's quick run and the published one.
QUICK_N, FULL_N = 300, 1000
#: Tasks per poll, per ack batch and per publish batch (the transports' default batch size).
BATCH = 100
#: Figures a budget holds exactly (after rounding to FIGURE_DIGITS) and those with a tolerance.
EXACT = ("statements", "round_trips")
FIGURE_DIGITS = 4
#: WAL varies by a few bytes per task (a page's free space decides between records).
WAL_TOLERANCE = 0.05
#: Operations whose own threads and timers run during the measurement (the django.tasks
#: worker: LISTEN, its scan of live kinds, attempts' liveness): a relative tolerance.
TIMED_TOLERANCE = 0.10
SERVER_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top",
    "pg_stat_statements.track_utility": "on", "autovacuum": "off", "fsync": "off",
    "full_page_writes": "off", "checkpoint_timeout": "1d", "max_wal_size": "10GB",
    "shared_buffers": "256MB", "max_connections": "60", "listen_addresses": "127.0.0.1",
}
Figures = dict[str, Any]


# -- the cluster ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cluster() -> Iterator[int]:
    """A PostgreSQL 15 cluster of its own, gone at the end of the block: its port."""
    folder = Path(tempfile.mkdtemp(prefix="delayq-counted-"))
    data, port = folder / "data", free_port()
    user: list[str | Path] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(folder, "postgres")
        user = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*user, PG_BIN / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-N",
                    "--no-instructions"], check=True, capture_output=True)
    opts = [a for k, v in SERVER_SETTINGS.items() for a in ("-c", f"{k}={v}")]
    server = subprocess.Popen([*user, PG_BIN / "postgres", "-D", data, "-p", str(port),
                               "-k", folder, *opts], stdout=subprocess.DEVNULL,
                              stderr=open(folder / "log", "wb"))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres").close()
                break
            except psycopg.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log = (folder / "log").read_text()
                    raise SystemExit(f"the cluster did not start: {log}") from None
                time.sleep(0.1)
        yield port
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(folder, ignore_errors=True)


# -- the relay: round trips ------------------------------------------------------------------

SSL_REQUEST, GSS_REQUEST = 80877103, 80877104


class Relay:
    """A TCP relay in front of the cluster that reads both directions of the protocol and
    counts a round trip each time a client sends after the server spoke (a pipeline of
    statements sent before reading is one). Start-up (until the server's first ReadyForQuery)
    and a lone Terminate are not round trips; each connection is counted in ``connections``."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.round_trips = self.connections = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def take(self) -> tuple[int, int]:
        """(round trips, connections) since the last take."""
        with self._lock:
            out, self.round_trips, self.connections = (
                (self.round_trips, self.connections), 0, 0)
        return out

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, server)
        sel.register(server, selectors.EVENT_READ, client)
        front, back = Frames(startup=True), Frames(startup=False)
        ready = spoke = False
        try:
            while True:
                for key, _ in sel.select():
                    src = key.fileobj
                    data = src.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    if src is client:
                        kinds = front.feed(data)
                        if front.ssl_asked:
                            back.expect_byte, front.ssl_asked = True, False
                        if ready and spoke and kinds != [b"X"]:
                            with self._lock:
                                self.round_trips += 1
                            spoke = False
                    else:
                        ready = ready or b"Z" in back.feed(data)
                        spoke = True
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            for s in (client, server):
                s.close()


class Frames:
    """An incremental reader of protocol messages: the kinds of those completed by each feed.
    The client's first message has no kind byte (start-up, or a request to encrypt, which the
    server answers with one byte)."""

    def __init__(self, startup: bool) -> None:
        self.buf = b""
        self.startup = startup
        self.ssl_asked = False
        self.expect_byte = False

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        kinds: list[bytes] = []
        while True:
            if self.expect_byte and self.buf:
                self.buf, self.expect_byte = self.buf[1:], False
                continue
            if self.startup:
                if len(self.buf) < 8:
                    return kinds
                size, code = struct.unpack("!ii", self.buf[:8])
                if len(self.buf) < size:
                    return kinds
                self.buf = self.buf[size:]
                self.startup = code in (SSL_REQUEST, GSS_REQUEST)
                self.ssl_asked = self.startup
                continue
            if len(self.buf) < 5:
                return kinds
            size = struct.unpack("!i", self.buf[1:5])[0]
            if len(self.buf) < size + 1:
                return kinds
            kinds.append(self.buf[:1])
            self.buf = self.buf[size + 1:]


# -- the meter -------------------------------------------------------------------------------

STATS = """SELECT queryid, query, calls, rows,
                  shared_blks_hit + shared_blks_read + shared_blks_dirtied, wal_bytes
           FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)"""
BUSY = """SELECT count(*) FROM pg_stat_activity
          WHERE datname = %s AND state NOT IN ('idle', 'idle in transaction')
            AND backend_type = 'client backend' AND query NOT ILIKE 'LISTEN%%'"""


def _normal(text: str) -> str:
    """A statement's text without comments, placeholders, constants (pg_stat_statements shows
    them as placeholders) and spaces: how a statement sent is matched to its block's name."""
    text = re.sub(r"--[^\n]*", "", text).replace("%%", "%")
    text = re.sub(r"(?i)extract\(\s*\w+\s+from", "extract(from", text)  # a constant too
    text = re.sub(r"(?i)%\(\w+\)[sb]|\$\d+|%s|'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b"
                  r"|\b(?:true|false|null)\b|::bytea|-", "", text)  # -1 is one constant
    return re.sub(r"\s+", "", text).lower()


def statement_names(tables: tuple[str, ...] = ("delayed_queue",)) -> dict[str, str]:
    """Normalised text -> name of every named statement of delayq's .sql files."""
    try:
        from delayq_transport.core.db.queries import Queries, raw_queries
    except ImportError:  # a revision before the core's parts (issue 43): one queries.py
        from delayq_transport.core.queries import (  # type: ignore[import-not-found,no-redef]
            Queries,
            raw_queries,
        )

    out: dict[str, str] = {}
    for table in tables:
        queries = Queries(table)
        for name in raw_queries():
            with contextlib.suppress(Exception):
                out.setdefault(_normal(str(queries[name])), name)
    return out


class Meter:
    """Snapshots of one database's counters (read on a direct connection to another)."""

    def __init__(self, port: int, relay: Relay, dbname: str,
                 names: dict[str, str] | None = None) -> None:
        self.conn = psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres",
                                    autocommit=True)
        self.relay, self.dbname = relay, dbname
        self.names = statement_names() if names is None else names

    def name_of(self, query: str) -> str:
        """The block a statement came from: its text, else the longest shared start (a
        statement whose text differs by what the driver inlined), else its first word."""
        text = _normal(query)
        if text in self.names:
            return self.names[text]
        size, best = max((len(os.path.commonprefix([text, k])), k) for k in self.names)
        return (self.names[best] if len(text) > 60 and size >= 0.6 * len(text)
                else query.split()[0].upper())

    def quiet(self, timeout_s: float = 10.0) -> None:
        """Wait until no statement of the database runs (a background send finishing)."""
        deadline = time.monotonic() + timeout_s
        while self.conn.execute(BUSY, [self.dbname]).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise TimeoutError("statements still running on the measured database")
            time.sleep(0.01)

    def snapshot(self) -> tuple[dict[int, tuple[Any, ...]], int]:
        self.quiet()
        rows = {r[0]: r for r in self.conn.execute(STATS, [self.dbname])}
        lsn = self.conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()
        return rows, int(lsn[0])  # type: ignore[index]

    @contextlib.contextmanager
    def measure(self, n: int, out: Figures) -> Iterator[None]:
        """Figures per task of what runs in the block, into ``out``."""
        before, lsn0 = self.snapshot()
        self.relay.take()
        yield
        n = out.pop("tasks", n)  # the block may say how many tasks it made
        after, lsn1 = self.snapshot()
        trips, conns = self.relay.take()
        calls = rows = buffers = 0
        named: dict[str, int] = {}
        for qid, (_, query, c, r, b, _w) in after.items():
            old = before.get(qid, (0, "", 0, 0, 0, 0))
            dc = c - old[2]
            if not dc:
                continue
            calls, rows, buffers = calls + dc, rows + r - old[3], buffers + b - old[4]
            name = self.name_of(query)
            named[name] = named.get(name, 0) + dc
        out.update(
            statements=per(calls, n), round_trips=per(trips, n), rows=per(rows, n),
            buffers=per(buffers, n), wal_bytes=per(lsn1 - lsn0, n), connections=conns,
            tasks=n, by_statement={k: per(v, n) for k, v in sorted(named.items())})


def per(total: float, n: int) -> float:
    return float(f"{total / n:.{FIGURE_DIGITS}g}")


# -- the operations --------------------------------------------------------------------------


@dataclass
class Ctx:
    url: str  # through the relay
    meter: Meter
    n: int
    figures: dict[str, Figures] = field(default_factory=dict)

    def measure(self, op: str) -> contextlib.AbstractContextManager[None]:
        return self.meter.measure(self.n, self.figures.setdefault(op, {}))

    def made(self, op: str, tasks: int) -> None:
        """Inside ``measure(op)``: the operation made ``tasks`` tasks, not ``n``."""
        self.figures[op]["tasks"] = tasks


PAYLOAD = b'{"task": "noop", "args": [], "kwargs": {}}' + b" " * 200


def _queue(ctx: Ctx, kind: str, **options: Any) -> Any:
    from delayq_transport import DelayedQueue

    queue = DelayedQueue(ctx.url, kind=kind, ensure_schema=False, **options)
    # Past the run: wake-ups are carried by the first publish and sent at close, never by the
    # announcer's thread at a moment the machine's load decides (core/queue/announce.py).
    queue.announcer.window_s = 3600.0
    return queue


def publish(ctx: Ctx) -> None:
    """A publish alone (``offer``), in batches (``offer_batch``), in the application's
    transaction (``transaction(conn)``, one transaction of the application per task)."""
    from delayq_transport.core import transaction

    with _queue(ctx, "pub") as q:
        q.offer("warm", PAYLOAD)
        q.offer_batch([("warm-b", PAYLOAD, None)])
        with ctx.measure("publish alone"):
            for i in range(ctx.n):
                q.offer(f"alone-{i}", PAYLOAD)
        with ctx.measure("publish in a batch"):
            for start in range(0, ctx.n, BATCH):
                q.offer_batch([(f"batch-{i}", PAYLOAD, None)
                               for i in range(start, min(start + BATCH, ctx.n))])
        with psycopg.connect(ctx.url) as app:
            with app.transaction(), transaction(app):
                q.offer("warm-t", PAYLOAD)
            with ctx.measure("publish in the application's transaction"):
                for i in range(ctx.n):
                    with app.transaction(), transaction(app):
                        q.offer(f"joined-{i}", PAYLOAD)


def _session(queue: Any) -> Any:
    from delayq_transport.core import Session

    return Session(queue, listen=None, polling_interval=3600, unheard_polling_interval=3600,
                   batch_size=BATCH, ack_flush_interval=3600, freeze_gc=False)


def _taken(ctx: Ctx, kind: str, op: str | None = None) -> tuple[Any, Any, Any, list[Any]]:
    """A queue with ``n`` due rows of ``kind``, a session, its subscription and every row
    polled (the polls measured as ``op``)."""
    q = _queue(ctx, kind, relaxed_consumer_commits=True)
    q.offer_batch([(f"{kind}-{i}", PAYLOAD, None) for i in range(ctx.n)])
    q.announcer.close()
    session = _session(q)
    sub = session.subscribe([kind])
    warm = session.subscribe([f"{kind}-warm"])
    session.poll(warm)
    session.unsubscribe(warm)
    envs: list[Any] = []
    with ctx.measure(op) if op else contextlib.nullcontext():
        while batch := session.poll(sub):
            envs += batch
    assert len(envs) == ctx.n, f"{kind}: polled {len(envs)} of {ctx.n}"
    return q, session, sub, envs


def consume(ctx: Ctx) -> None:
    """Poll (the session's polls of ``batch_size``, the last one empty), ack (as a worker
    acks, one delivery at a time; the session deletes them in batches), release (each at
    once), dead letter (each at once)."""
    q, session, sub, envs = _taken(ctx, "work", "poll")
    with ctx.measure("ack"):
        for env in envs:
            session.ack(sub, [env])
        session.flush()
    session.close()
    q.close()
    q, session, sub, envs = _taken(ctx, "back")
    with ctx.measure("release"):
        for env in envs:
            session.release(sub, [env])
    session.close()
    q.close()
    q, session, sub, envs = _taken(ctx, "dead")
    with ctx.measure("dead letter"):
        for env in envs:
            session.dead_letter(sub, [env], "dead.XQ", 86400.0, [None])
    session.close()
    q.close()


def beat_install(ctx: Ctx) -> None:
    """A beat scheduler's first refresh: about ``n`` occurrences of five entries (every
    second, a horizon of ``n / 5`` seconds), installed by delayq_beat's Installer on an
    injected clock; per occurrence installed."""
    from zoneinfo import ZoneInfo

    from delayq_beat import BeatStore, Installer, Settings, make_spec

    at = datetime(2030, 1, 1, 12, tzinfo=UTC)
    with _queue(ctx, "celery", clock=lambda: at) as q:
        settings = Settings(refresh_interval=timedelta(seconds=1),
                            horizon=timedelta(seconds=ctx.n // 5), min_occurrences=1)
        installer = Installer(q, BeatStore(q.db, q.table), ZoneInfo("UTC"), settings)
        installer.refresh({})
        entries = {f"tick{i}": make_spec(f"tick{i}", "tasks.tick", 1.0) for i in range(5)}
        with ctx.measure("beat install"):
            ctx.made("beat install", sum(installer.refresh(entries).installed.values()))


def django_tasks(ctx: Ctx) -> None:
    """django.tasks: ``enqueue`` of a no-op task, then a worker (threads=1) running them
    until none is left, its start-up and shutdown included; in a Python 3.12 child (Django 6)
    that says when each phase starts and ends."""
    if not PY312.exists():
        print(f"django.tasks skipped: no {PY312}", file=sys.stderr)
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(BENCH_DIR)])}
    child = subprocess.Popen([PY312, __file__, "--django-child", ctx.url, str(ctx.n)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdin is not None and child.stdout is not None
    for op in ("django.tasks enqueue", "django.tasks run"):
        assert child.stdout.readline().strip() == "ready", "the django.tasks child failed"
        with ctx.measure(op):
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done", "the django.tasks child failed"
    child.stdin.close()
    assert child.wait(60) == 0


def django_child(url: str, n: int) -> None:
    """The child of :func:`django_tasks` (Python 3.12, Django 6)."""
    from urllib.parse import urlsplit

    import django
    from django.conf import settings

    parts = urlsplit(url)
    settings.configure(
        INSTALLED_APPS=["delayq_transport.django"], USE_TZ=True,
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "USER": "postgres",
                               "NAME": parts.path.lstrip("/"), "HOST": parts.hostname,
                               "PORT": str(parts.port), "OPTIONS": {"sslmode": "disable"}}},
        TASKS={"default": {"BACKEND": "delayq_transport.django.tasks.DelayqBackend",
                           "QUEUES": ["default"]}})
    django.setup()
    from django.tasks import task, task_backends

    # The worker finds a task by its function's module path: the name must hold the task.
    noop = globals()["_noop"] = task(_noop)
    noop.using(queue_name="default").enqueue()  # warm: the backend's pool and statements
    backend = task_backends["default"]
    backend.store().queue.announcer.window_s = 3600.0  # as _queue does
    run_all(backend, 1)

    def phase(work: Callable[[], None]) -> None:
        print("ready", flush=True)
        assert sys.stdin.readline().strip() == "go"
        work()
        print("done", flush=True)

    def enqueue() -> None:
        for _ in range(n):
            noop.enqueue()

    phase(enqueue)

    phase(lambda: run_all(backend, n))


def run_all(backend: Any, n: int) -> None:
    """A worker of one thread runs ``n`` tasks, then stops (acks deleted every BATCH, as
    the consumers of :func:`consume`)."""
    from delayq_transport.django.worker import Worker

    worker = Worker(backend, threads=1, shutdown_timeout=10)
    worker.session.ack_flush_interval = 3600.0
    thread = threading.Thread(target=worker.run)
    thread.start()
    _until(lambda: worker.done >= n)
    worker.stop()
    thread.join(30)


def _noop() -> None:
    """The task django.tasks runs (by its module path: this file, ``counted``)."""


def _until(done: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done in {timeout_s:.0f} s")
        time.sleep(0.01)


#: Rows per task of ``n`` that the Spark write takes (a bulk path: per-partition costs are
#: spread over many rows, as in use).
SPARK_ROWS_PER_N = 100


def spark_write(ctx: Ctx) -> None:
    """``schedule_tasks`` of ``n`` x 100 rows (8 partitions, ``local[2]``, a due time each
    within a day), after a warm-up job; per row. Slow (a JVM): only with ``--spark``."""
    from pyspark.sql import functions as F

    from delayq_transport.spark import local_session, schedule_tasks

    spark = local_session("delayq-counted", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)

    def job(rows: int, task: str) -> Any:
        df = spark.range(rows, numPartitions=8).select(
            F.col("id").alias("user_id"),
            (F.lit(base) + F.make_interval(secs=F.col("id") % 86_400)).alias("eta"))
        return schedule_tasks(df, task, "eta", args=["user_id"], queue="spark",
                              database_url=ctx.url, run_id=f"counted-{task}")

    try:
        job(1000, "warm.up")
        rows = ctx.n * SPARK_ROWS_PER_N
        with ctx.measure("Spark write"):
            ctx.made("Spark write", job(rows, "bench.remind").created)
    finally:
        spark.stop()


OPERATIONS: dict[str, Callable[[Ctx], None]] = {
    "publish": publish, "consume": consume, "beat": beat_install, "django": django_tasks,
    "spark": spark_write}
#: Left out unless asked for (``--spark``, ``--only spark``): a JVM's start takes longer than
#: everything else together.
SLOW = ("spark",)


# -- a run, the records, the budgets ---------------------------------------------------------


def make_database(admin: str) -> None:
    """The measured database ``delayq``; the meter reads pg_stat_statements from ``admin``'s."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE delayq")
        conn.execute("CREATE EXTENSION pg_stat_statements")


def measure(n: int, groups: list[str] | None = None, about: dict[str, str] | None = None
            ) -> dict[str, Figures]:
    """Every operation's figures per task on a fresh cluster (``groups``: of OPERATIONS);
    ``about`` gets the machine's description (bench/records.py)."""
    from delayq_transport.core import migrate
    from delayq_transport.core.db.database import Database

    with cluster() as port:
        relay = Relay(port)
        admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        make_database(admin)
        if about is not None:
            sys.path.insert(0, str(BENCH_DIR))
            from records import machine

            about["machine"] = machine(admin)
        url = f"postgresql://postgres@127.0.0.1:{relay.port}/delayq?sslmode=disable"
        db = Database(url)
        try:
            migrate(db, "delayed_queue")
        finally:
            db.close()
        ctx = Ctx(url, Meter(port, relay, "delayq"), n)
        for name in groups or [g for g in OPERATIONS if g not in SLOW]:
            OPERATIONS[name](ctx)
        return ctx.figures


#: The figures of a record, per task (the page shows them with four significant digits).
PER_TASK = ("statements", "round_trips", "rows", "buffers", "wal_bytes")


def records(figures: dict[str, Figures], machine: str) -> list[dict[str, Any]]:
    """One flat record per operation (bench/records.py): the operation is the scenario."""
    sys.path.insert(0, str(BENCH_DIR))
    from records import command, now, revision

    rev, when, cmd = revision(), now(), command().replace("bench/run.py", "bench/counted.py")
    return [{"system": "delayq", "scenario": op, "revision": rev, "round": 1,
             "figures": {**{f"{k}_per_task": f[k] for k in PER_TASK},
                         "connections": f["connections"], "tasks": f["tasks"]},
             "by_statement": f["by_statement"], "command": cmd, "date": when,
             "machine": machine}
            for op, f in figures.items()]


def budgets_of(figures: dict[str, Figures], n: int) -> dict[str, Any]:
    """The budgets a run sets: its figures, with the tolerance each is compared with."""
    return {"tasks": n, "update": "python3 bench/counted.py --budgets", "operations": {
        op: {"tolerance": TIMED_TOLERANCE if op.startswith("django") else 0.0,
             "wal_tolerance": WAL_TOLERANCE, **{k: f[k] for k in (*EXACT, "wal_bytes")}}
        for op, f in figures.items()}}


def over_budget(figures: dict[str, Figures], budgets: dict[str, Any]) -> list[str]:
    """What exceeds its budget, one line each: operation, figure, budget, measured, and the
    statements by name (the one that grew shows there)."""
    out = []
    for op, budget in budgets["operations"].items():
        got = figures.get(op)
        if got is None:
            continue
        for fig in (*EXACT, "wal_bytes"):
            slack = budget["tolerance"] + (budget["wal_tolerance"] if fig == "wal_bytes" else 0)
            if got[fig] > budget[fig] * (1 + slack):
                out.append(f"{op}: {fig} per task {got[fig]} > budget {budget[fig]}"
                           + (f" (+{slack:.0%})" if slack else "")
                           + f"; by statement: {got['by_statement']}")
    return out


# -- issue 43: the drain at millions of waiting rows -----------------------------------------


def drain(rows: int, n: int, tree: Path) -> Figures:
    """A Celery worker (``-P prefork -c 2``, prefetch 4, transport options at their defaults)
    of ``tree``'s delayq draining ``n`` no-ops queued first, with ``rows`` far-future rows
    waiting in its queue (bench/apps: the app of the ``scale`` scenario); per task of the
    drain, the worker's start and warm shutdown included. The end is the app's report (Redis)
    of the last task, so nothing but the worker touches the measured database meanwhile."""
    sys.path.insert(0, str(BENCH_DIR / "apps"))
    import report
    from steady import load_far_rows

    with cluster() as port:
        relay = Relay(port)
        admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        make_database(admin)
        url = f"postgresql://postgres@127.0.0.1:{relay.port}/delayq?sslmode=disable"
        key = f"counted-drain-{os.getpid()}-{time.time_ns()}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(BENCH_DIR / "apps")]),
               "BENCH_BROKER_URL": f"delayq+{url}", "BENCH_QUEUE": "scale",
               "BENCH_TRANSPORT_OPTIONS": "{}", "BENCH_PREFETCH": "4"}
        code = ("import sys; from delayq_transport import DelayedQueue; "
                "DelayedQueue(sys.argv[1], kind='scale').close()")
        subprocess.run([sys.executable, "-c", code, url], env=env, check=True)
        load_far_rows(admin.rsplit("/", 1)[0] + "/delayq", "scale", rows)
        send = ("import celery_app as a\nwith a.app.producer_or_acquire() as p:\n"
                f"    for i in range({n}): a.noop.apply_async(({key!r}, {n}), producer=p)\n")
        subprocess.run([sys.executable, "-c", send], env=env, check=True, cwd=BENCH_DIR / "apps")
        out: Figures = {}
        names = json.loads(subprocess.run([sys.executable, __file__, "--names"], env=env,
                                          capture_output=True, check=True, text=True).stdout)
        with Meter(port, relay, "delayq", names).measure(n, out):
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", "prefork",
                 "-c", "2", "-Q", "scale", "--without-heartbeat", "--without-gossip",
                 "--without-mingle", "-l", "WARNING"], env=env, cwd=BENCH_DIR / "apps",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            start = time.monotonic()
            _until(lambda: bool(report.client().exists(f"{key}:done")), 600.0)
            out["seconds"] = round(time.monotonic() - start, 2)
            worker.terminate()  # a warm shutdown: the acks still pending are deleted
            worker.wait(60)
        report.client().delete(key, f"{key}:first", f"{key}:done")
        out["machine"] = _machine(admin)
        return out


def _machine(admin: str) -> str:
    sys.path.insert(0, str(BENCH_DIR))
    from records import machine

    return machine(admin)


def drain_record(rows: int, n: int, tree: Path) -> dict[str, Any]:
    """:func:`drain` as a record of ``bench/results/counted-drain.json``, one per revision."""
    sys.path.insert(0, str(BENCH_DIR))
    from records import command, now, revision

    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    f = drain(rows, n, tree)
    return {"system": "celery-delayq", "scenario": f"drain at {rows:,} waiting rows",
            "revision": revision() if tree == REPO_ROOT else head, "round": 1,
            "figures": {**{f"{k}_per_task": f[k] for k in PER_TASK}, "seconds": f["seconds"],
                        "connections": f["connections"], "tasks": n},
            "by_statement": f["by_statement"], "machine": f["machine"], "date": now(),
            "command": command().replace("bench/run.py", "bench/counted.py")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, help=f"tasks per operation (default {FULL_N}; with "
                        f"--budgets or --check {QUICK_N}, as the suite runs it)")
    parser.add_argument("--only", nargs="*", choices=list(OPERATIONS), help="operation groups")
    parser.add_argument("--spark", action="store_true", help="add the Spark write (slow)")
    parser.add_argument("--budgets", action="store_true",
                        help="rewrite bench/budgets.json from this run")
    parser.add_argument("--check", action="store_true",
                        help="compare with bench/budgets.json; exit 1 when over")
    parser.add_argument("--drain", type=int, metavar="ROWS",
                        help="issue 43: a drain with ROWS far-future rows waiting")
    parser.add_argument("--tree", type=Path, default=REPO_ROOT,
                        help="the checkout whose delayq --drain runs (a worktree of a revision)")
    parser.add_argument("--django-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--names", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.names:  # the statement names of the delayq imported (--drain's other tree)
        print(json.dumps(statement_names()))
        return 0
    if args.django_child:
        django_child(args.django_child[0], int(args.django_child[1]))
        return 0
    if args.drain is not None:
        record = drain_record(args.drain, 5000, args.tree.resolve())
        print(json.dumps(record, indent=1))
        sys.path.insert(0, str(BENCH_DIR))
        from records import load

        runs = [r for r in load("counted-drain") if (r["scenario"], r["revision"]) !=
                (record["scenario"], record["revision"])]
        (BENCH_DIR / "results" / "counted-drain.json").write_text(
            json.dumps([*runs, record], indent=1, sort_keys=True) + "\n")
        return 0
    n = args.n or (QUICK_N if args.budgets or args.check else FULL_N)
    about: dict[str, str] = {}
    groups = args.only or ([*OPERATIONS] if args.spark else None)
    figures = measure(n, groups, about)
    for op, f in figures.items():
        print(f"{op:42} " + " ".join(f"{k}={f[k]}" for k in (*EXACT, "rows", "buffers",
                                                               "wal_bytes")))
    if not args.only and args.spark and n == FULL_N:
        sys.path.insert(0, str(BENCH_DIR))
        from records import save

        save("counted", records(figures, about["machine"]), replace_all=True)
    if args.budgets:
        BUDGETS.write_text(json.dumps(budgets_of(figures, n), indent=1, sort_keys=True) + "\n")
    if args.check:
        over = over_budget(figures, json.loads(BUDGETS.read_text()))
        print("\n".join(over) or "within budget")
        return 1 if over else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
