"""Connections per process: what each kind of delayq process holds open on PostgreSQL.

Starts, against a fresh database, one of each: a ``celery worker`` (solo pool), a ``celery
worker -P prefork -c 2`` whose tasks publish a follow-up from the pool child, a producer
process, a ``celery beat -S delayq_beat.Scheduler``, a ``dramatiq`` worker process (8 threads)
and ``delayq web`` answering requests. It samples ``pg_stat_activity`` every 0.2 s while
tasks flow and after they stopped, and maps each backend to the process on the other end
of its socket (psutil), so every connection is counted against the process that holds it:
its pool (``application_name`` ``delayq`` / ``delayq-relaxed``), LISTEN, or other.

    python bench/connection_budget.py [--pool-size 4] [--single-pool] [--tasks 2000]

Raw numbers go to ``bench/results/connection_budget[_single_pool].json`` and their section of
docs/benchmarks.md (``--no-docs``: not the page).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import psycopg

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))
sys.path.insert(0, str(BENCH.parent))

from _common import (  # noqa: E402
    DEFAULT_ADMIN_URL,
    command_line,
    console,
    fresh_database,
    git_revision,
    markdown_table,
    prose,
    run_line,
    write_results,
)
from _targets import replace_section  # noqa: E402
from topology.clusters import free_port, wait_for  # noqa: E402
from topology.services import (  # noqa: E402
    RESULTS_DDL,
    Service,
    beat_args,
    process_env,
    python_module,
    worker_args,
)

from delayq_transport import Database, migrate  # noqa: E402

PRODUCER = """
import os, sys, time
from celery import Celery
import delayq_transport
app = Celery("budget-producer", broker=os.environ["DELAYQ_BROKER_URL"])
app.conf.broker_transport_options = __import__("json").loads(os.environ["DELAYQ_TRANSPORT_OPTIONS"])
n = int(sys.argv[1])
for i in range(n):
    name = "topology.relay" if i % 2 else "topology.note"
    app.send_task(name, args=[f"b-{i}"], queue=("prefork" if i % 2 else "celery"))
print("published", n, flush=True)
time.sleep(3600)
"""
TICK = {"tick": {"task": "topology.note", "schedule": 1.0, "args": ["tick"]}}


def role_of(pid: int, roots: dict[int, str]) -> str:
    """The service a process belongs to: itself or its nearest started ancestor; a pool child
    of a worker is told apart from its main process."""
    try:
        proc = psutil.Process(pid)
        chain = [proc, *proc.parents()]
    except psutil.Error:
        return "gone"
    for depth, p in enumerate(chain):
        if p.pid in roots:
            return roots[p.pid] + (" (pool child)" if depth and "worker" in roots[p.pid]
                                   and "dramatiq" not in roots[p.pid] else "")
    return "other"


Sample = dict[tuple[str, int], dict[str, int]]


def sample(admin_url: str, dbname: str, roots: dict[int, str]) -> Sample:
    """{(role, pid): {pool: connections}} of this moment."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT client_port, application_name, query FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid() AND client_port IS NOT NULL",
            (dbname,)).fetchall()
    by_port = {c.laddr.port: c.pid for c in psutil.net_connections(kind="tcp")
               if c.pid and c.raddr and c.raddr.port == 5432}
    out: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for port, app, query in rows:
        pid = by_port.get(port)
        if pid is None:
            continue
        pool = app or ("LISTEN" if query.startswith("LISTEN") else "other")
        if pool not in ("delayq", "delayq-relaxed", "LISTEN"):
            pool = "other"
        out[(role_of(pid, roots), pid)][pool] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool-size", type=int, default=None,
                        help="transport option pool_size (default: the transport's)")
    parser.add_argument("--single-pool", action="store_true",
                        help="transport option single_pool (one pool per process)")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md alone")
    args = parser.parse_args()
    options: dict[str, Any] = {"polling_interval": 1}
    if args.pool_size:
        options["pool_size"] = args.pool_size
    if args.single_pool:
        options["single_pool"] = True
    logs = Path(tempfile.mkdtemp(prefix="delayq-budget-"))
    with fresh_database(args.admin_url, "delayq_bench_budget") as url:
        dbname = url.rsplit("/", 1)[1]
        with Database(url) as db:
            migrate(db, "delayed_queue")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(RESULTS_DDL)
        env = process_env(DELAYQ_BROKER_URL="delayq+" + url, DELAYQ_DATABASE_URL=url,
                          DELAYQ_RESULTS_URL=url, DELAYQ_TRANSPORT_OPTIONS=json.dumps(options),
                          BEAT_SCHEDULE=json.dumps(TICK))
        web_port = free_port()
        services = {
            "worker, solo": Service(python_module(*worker_args("solo", "-Q", "celery")), env,
                                    logs / "solo.log"),
            "worker, prefork -c 2": Service(python_module(*worker_args(
                "prefork", "-P", "prefork", "-c", "2", "-Q", "prefork")), env,
                logs / "prefork.log"),
            "beat": Service(python_module(*beat_args()), env, logs / "beat.log"),
            "dramatiq worker process (8 threads)": Service(python_module(
                "dramatiq", "topology_dramatiq", "--processes", "1", "--threads", "8"), env,
                logs / "dramatiq.log"),
            "delayq web": Service(python_module("delayq_transport", "web", "--port",
                                                str(web_port)), env, logs / "web.log"),
        }
        try:
            for name, ready in (("worker, solo", "ready."), ("worker, prefork -c 2", "ready."),
                                ("beat", "delayq beat: refreshed"),
                                ("dramatiq worker process (8 threads)", "ready for action"),
                                ("delayq web", "Ctrl-C stops it")):
                services[name].wait_for_log(ready, timeout=120)
            roots = {s.proc.pid: name for name, s in services.items()}
            (logs / "producer.py").write_text(PRODUCER)
            producer = Service([sys.executable, str(logs / "producer.py"), str(args.tasks)],
                               env, logs / "producer.log")
            roots[producer.proc.pid] = "producer process"
            services["producer process"] = producer
            stop = threading.Event()
            threading.Thread(target=_browse, args=(web_port, stop), daemon=True).start()
            peak: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            peak_total: dict[str, int] = defaultdict(int)
            done = [False]

            def busy() -> bool:
                for (role, _), pools in sample(args.admin_url, dbname, roots).items():
                    for pool, n in pools.items():
                        peak[role][pool] = max(peak[role][pool], n)
                    peak_total[role] = max(peak_total[role], sum(pools.values()))
                with psycopg.connect(url, autocommit=True) as conn:
                    ran = conn.execute("SELECT count(*) FROM executions WHERE arg LIKE '\"b-%%'"
                                       ).fetchone()
                done[0] = bool(ran and ran[0] >= args.tasks)  # relays record their note
                return done[0]

            wait_for(busy, "every task (and every relayed one) to run", timeout=300,
                     interval=0.2)
            stop.set()
            time.sleep(2)  # let the pools settle: what is left open is the steady state
            steady = sample(args.admin_url, dbname, roots)
        finally:
            for service in services.values():
                service.stop()
    rows, raw = [], []
    pools = ("delayq", "delayq-relaxed", "LISTEN", "other")
    for role in sorted(peak):
        held = [p for (r, _), p in steady.items() if r == role]
        idle = max((sum(p.values()) for p in held), default=0)
        rows.append([role, *(peak[role].get(p, 0) for p in pools), peak_total[role], idle])
        raw.append({"process": role, "peak": dict(peak[role]), "peak_total": peak_total[role],
                    "after_load_max": idle})
    table = markdown_table(["process", "delayq pool", "relaxed pool", "LISTEN", "other",
                            "peak (per process)", "after the load"], rows, "lrrrrrr")
    console.print(table)
    if not args.no_write:
        name = "connection_budget" + ("_single_pool" if args.single_pool else "")
        data = {"command": command_line(), "revision": git_revision(), "options": options,
                "tasks": args.tasks, "processes": raw, "table": table}
        write_results(name, data)
        if not args.no_docs:
            replace_section(name, section(data))


def section(data: dict[str, Any]) -> str:
    """A section of docs/benchmarks.md from one ``connection_budget*.json`` alone."""
    options = data.get("options", {})
    single = bool(options.get("single_pool"))
    command = data.get("command") or "python bench/connection_budget.py" + (
        " --single-pool --pool-size 2" if single else "")
    shown = ", ".join(f"`{k}={v!r}`" for k, v in sorted(options.items()))
    how = prose(f"""One process of each kind against one database while {data.get("tasks", 0):,}
tasks run (half of them published from a prefork pool child), transport options {shown};
`pg_stat_activity` sampled every 0.2 s, each backend mapped to the process holding it: the most
each process held at once, per pool (`delayq`: flushed commits, `delayq-relaxed`: relaxed ones,
LISTEN), and what it still held once the load stopped.""")
    head = run_line(command, data.get("revision"), data.get("finished_at"), data.get("machine"))
    title = "Connections per process" + (", single_pool" if single else "")
    return f"## {title}\n\n{head}\n\n{data['table']}\n\n{how}"

def _browse(port: int, stop: threading.Event) -> None:
    """Keep ``delayq web`` answering: its pages and API run counts on its pool."""
    while not stop.is_set():
        for path in ("/", "/tasks", "/api/status"):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read()
            except OSError:
                pass


if __name__ == "__main__":
    main()
