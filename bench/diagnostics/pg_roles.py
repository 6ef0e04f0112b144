"""PostgreSQL's CPU per task by the role of each backend, beside a Celery benchmark.

Every 0.2 s it reads ``pg_stat_activity`` and each backend's CPU time (psutil), and names each
backend by what it serves: the client process at the other end of its TCP connection (a
benchmark producer, the Celery worker, something else), ``:listen`` for a connection whose last
statement was ``LISTEN``, or the auxiliary process type (WAL writer, checkpointer). At the end
it prints each role's CPU seconds, and µs per task when ``--tasks`` says how many ran.

Why it exists: end to end, PostgreSQL spends more CPU per task than RabbitMQ's server
(``profile_celery.py --e2e``); this says which backends spend it. Backends that start and end
between two samples are missed, so the sum is a lower bound.

    python bench/diagnostics/pg_roles.py --seconds 45 --tasks 30600 &
    python bench/bench_celery.py --only throughput --brokers delayq --no-write
"""

from __future__ import annotations

import collections
import time

import click
import psutil
import psycopg
from cpu_shares import process_group


def _client_role(pid: int | None) -> str:
    """The client's group as ``cpu_shares.py`` names it (producer, worker-main, ...)."""
    if pid is None:
        return "other"
    try:
        proc = psutil.Process(pid)
        return process_group(proc, " ".join(proc.cmdline()))
    except psutil.Error:
        return "other"


def _role(app: str, backend_type: str, query: str, client: int | None) -> str:
    if backend_type != "client backend":
        return backend_type
    role = f"{app or 'client'}:{_client_role(client)}"
    return f"{role}:listen" if query.startswith("LISTEN") else role


@click.command()
@click.option("--seconds", default=45.0, show_default=True, help="How long to sample.")
@click.option("--url", default="postgresql://postgres@127.0.0.1:5432/postgres",
              show_default=True, help="The server the benchmark uses.")
@click.option("--tasks", default=0, help="Tasks run meanwhile: also print µs per task.")
def main(seconds: float, url: str, tasks: int) -> None:
    first: dict[int, float] = {}
    last: dict[int, tuple[str, float]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        own = conn.info.backend_pid
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            ports = {c.laddr.port: c.pid for c in psutil.net_connections("tcp")
                     if c.laddr and c.pid}
            rows = conn.execute(
                "SELECT pid, application_name, backend_type, coalesce(query, ''), client_port "
                "FROM pg_stat_activity WHERE pid <> %s", (own,)).fetchall()
            for pid, app, backend_type, query, port in rows:
                try:
                    times = psutil.Process(pid).cpu_times()
                except psutil.Error:
                    continue
                cpu = times.user + times.system
                first.setdefault(pid, cpu)
                role = _role(app, backend_type, query, ports.get(port))
                # A role once seen as the LISTEN connection stays so (its query does not change).
                kept = last.get(pid, (role, 0.0))[0]
                last[pid] = (kept if kept.endswith(":listen") else role, cpu)
            time.sleep(0.2)
    used: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for pid, (role, cpu) in last.items():
        used[role] += cpu - first[pid]
        count[role] += 1
    for role, seconds_used in sorted(used.items(), key=lambda kv: -kv[1]):
        per_task = f"  {seconds_used * 1e6 / tasks:6.1f} µs/task" if tasks else ""
        print(f"{role:36s} {seconds_used:7.2f} s  ({count[role]} processes){per_task}")


if __name__ == "__main__":
    main()
