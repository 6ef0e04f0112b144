"""Where the time goes: CPU, statements and WAL per no-op Celery task, per broker.

For each broker the same two steps as ``bench_celery.py``'s drain phase, measured instead of
timed: one producer process publishes N no-op tasks (nothing consumes), then one ``celery
worker`` (same settings as the benchmark) drains them. With ``--e2e``, instead the
throughput phase: the worker runs while the benchmark's producer processes publish N tasks.
For each step:

- producer / worker main process / pool children CPU per task (psutil);
- broker server CPU per task: every process of the PostgreSQL cluster (backends, WAL writer,
  checkpointer), the ``redis-server`` or RabbitMQ's ``beam.smp`` process;
- for delayq: statements per task and their execution time per task from
  ``pg_stat_statements``, and WAL bytes per task (``pg_current_wal_lsn`` difference);
- optionally (``--py-spy``) the worker main process' hottest functions during the drain;
- end to end, for delayq: the worker's own counts per task (NOTIFYs received, LISTEN reads,
  polls, rows per poll, loop ticks), from ``_profile_hooks/sitecustomize.py``.

``pg_stat_statements`` must be preloaded, which the shared development server is not: run this
against a throwaway cluster (``--admin-url postgresql://postgres@127.0.0.1:5499/postgres``,
created with ``initdb`` and ``shared_preload_libraries = 'pg_stat_statements'``). Redis and
RabbitMQ are the shared servers, so their CPU figures include whatever else uses them.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click
import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common, the harness

import _celery as cel  # noqa: E402
from _common import console, machine_cpu, markdown_table  # noqa: E402
from _common import cpu_seconds as _cpu  # noqa: E402


def _machine_busy() -> float:
    """CPU seconds the whole machine spent not idle (every process, the kernel's interrupt
    work included): what the processes above leave out shows as unattributed."""
    return machine_cpu()[0]


class ServerCpu:
    """CPU of a broker's server processes; new children are counted from zero."""

    def __init__(self, broker: str, admin_url: str) -> None:
        self.procs = self._find(broker, admin_url)
        self.start = {p.pid: _cpu(p) for p in self._all()}

    @staticmethod
    def _find(broker: str, admin_url: str) -> list[psutil.Process]:
        if broker.startswith("delayq"):
            with psycopg.connect(admin_url, autocommit=True) as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            return [psutil.Process(row[0]).parent()]  # the postmaster
        name = "redis-server" if broker == "redis" else "beam.smp"
        return [p for p in psutil.process_iter(["name"]) if p.info["name"] == name]

    def _all(self) -> list[psutil.Process]:
        found = []
        for proc in self.procs:
            found.append(proc)
            try:
                found += proc.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        return found

    def used(self) -> float:
        return sum(_cpu(p) - self.start.get(p.pid, 0.0) for p in self._all())


class PgStats:
    """pg_stat_statements and WAL position of one database, before and after."""

    def __init__(self, admin_url: str, db_url: str) -> None:
        self.admin_url, self.dbname = admin_url, db_url.rsplit("/", 1)[1]
        self.start = self._read()

    def _read(self) -> tuple[dict[str, tuple[int, float, int]], int]:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT query, sum(calls)::bigint, sum(total_exec_time), sum(rows)::bigint"
                " FROM pg_stat_statements s"
                " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s GROUP BY query",
                (self.dbname,)).fetchall()
            lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert lsn is not None
        return {r[0]: (int(r[1]), float(r[2]), int(r[3])) for r in rows}, int(lsn[0])

    def delta(self, n: int) -> dict[str, Any]:
        end, lsn = self._read()
        per: list[tuple[str, float, float, float]] = []
        for query, (calls, ms, rows) in end.items():
            c0, m0, r0 = self.start[0].get(query, (0, 0.0, 0))
            if calls - c0:
                per.append((_label(query), (calls - c0) / n, (ms - m0) * 1000 / n,
                            (rows - r0) / (calls - c0)))
        per.sort(key=lambda x: -x[2])
        return {"statements_per_task": round(sum(p[1] for p in per), 3),
                "exec_us_per_task": round(sum(p[2] for p in per), 1),
                "wal_bytes_per_task": round((lsn - self.start[1]) / n, 1),
                "by_statement": [{"statement": q, "calls_per_task": round(c, 4),
                                  "exec_us_per_task": round(us, 1), "rows_per_call": round(r, 2)}
                                 for q, c, us, r in per[:10]]}


def _label(query: str) -> str:
    text = " ".join(query.split())
    return text[:90]


def _pyspy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration",
                             str(max(1, int(seconds))), "--rate", "250", "--nonblocking",
                             "--threads",
                             "--format", "raw", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


Spies = dict[str, tuple[subprocess.Popen[bytes], Path]]


def _start_spies(procs: dict[str, psutil.Process], seconds: float, logdir: Path,
                 prefix: str) -> Spies:
    """A py-spy sampler per named process, each writing ``<prefix>-<name>.raw``."""
    return {name: (_pyspy(proc.pid, seconds, raw), raw)
            for name, proc in procs.items()
            for raw in (logdir / f"{prefix}-{name}.raw",)}


def _stop_spies(spies: Spies) -> dict[str, Any]:
    """Stop the samplers (py-spy writes its output on Ctrl-C) and read their hottest functions
    as ``<name>_top_functions``."""
    out: dict[str, Any] = {}
    for spy, _ in spies.values():
        spy.send_signal(signal.SIGINT)
    for name, (spy, raw) in spies.items():
        spy.wait(timeout=60)
        if raw.exists():
            out[f"{name}_top_functions"] = _top_functions(raw)
    return out


def _top_functions(raw: Path, limit: int = 30) -> dict[str, Any]:
    """Share of samples per thread, and (function, self %, total %) over all threads."""
    self_n: collections.Counter[str] = collections.Counter()
    total_n: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        if len(parts) < 2:
            continue
        n = int(count)
        samples += n
        threads[parts[0].split(": ", 1)[-1]] += n
        frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].split(":")[0].rstrip(")")
                  for f in parts[1:]]
        self_n[frames[-1]] += n
        for frame in set(frames):
            total_n[frame] += n
    if not samples:
        return {}
    return {"samples": samples,
            "threads_pct": {t: round(100 * c / samples, 1) for t, c in threads.most_common()},
            "functions": [(f, round(100 * self_n[f] / samples, 1),
                           round(100 * total_n[f] / samples, 1))
                          for f, _ in total_n.most_common(limit)],
            "self_top": [(f, round(100 * c / samples, 1)) for f, c in self_n.most_common(limit)]}


def profile(broker: str, cfg: cel.Settings, n: int, pyspy: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    key = cel.counter_key(cfg, broker, "prof", uuid.uuid4().hex[:8])
    jobs = cel.noop_jobs(key, n)
    with cel.broker_state(broker, "profile", cfg) as run:
        with cel.Producers(run.env, 1) as producers:
            child = psutil.Process(producers.pool._pool[0].pid)  # type: ignore[attr-defined]
            server = ServerCpu(broker, cfg.admin_url)
            pg = PgStats(cfg.admin_url, run.db_url) if run.db_url else None
            cpu0, t0 = _cpu(child), time.time()
            done = producers.submit(cel.publish, jobs)
            while len(done) < len(jobs) and not producers.errors:
                time.sleep(0.02)
            out["publish"] = {"tasks_per_s": round(n / (time.time() - t0), 1),
                              "producer_cpu_us_per_task": round((_cpu(child) - cpu0) * 1e6 / n),
                              "server_cpu_us_per_task": round(server.used() * 1e6 / n)}
            if pg:
                out["publish"].update(pg.delta(n))
        with cel.running_worker(run.env, f"prof-{broker}", cfg) as worker:
            main = psutil.Process(worker.proc.pid)
            kids = main.children(recursive=True)
            server = ServerCpu(broker, cfg.admin_url)
            pg = PgStats(cfg.admin_url, run.db_url) if run.db_url else None
            c_main, c_kids, t0 = _cpu(main), sum(_cpu(k) for k in kids), time.time()
            spies = _start_spies({"worker": main}, 60, cfg.logdir, broker) if pyspy else {}
            client = cel.counter_client(cfg)
            while cel.count_of(client, key) < n and time.time() - t0 < 300:
                time.sleep(0.02)
            seconds = time.time() - t0
            out["drain"] = {
                "tasks_per_s": round(n / seconds, 1),
                "worker_main_cpu_us_per_task": round((_cpu(main) - c_main) * 1e6 / n),
                "pool_children_cpu_us_per_task": round(
                    (sum(_cpu(k) for k in kids) - c_kids) * 1e6 / n),
                "server_cpu_us_per_task": round(server.used() * 1e6 / n)}
            if pg:
                out["drain"].update(pg.delta(n))
            out["drain"].update(_stop_spies(spies))
    return out


HOOKS = Path(__file__).resolve().parent / "_profile_hooks"


def profile_e2e(broker: str, cfg: cel.Settings, n: int, pyspy: bool = False) -> dict[str, Any]:
    """Producers and worker together, as in ``bench_celery.py``'s throughput phase (its
    ``throughput_threads`` phase with ``cfg.producer_threads`` above 1)."""
    key = cel.counter_key(cfg, broker, "e2e", uuid.uuid4().hex[:8])
    warm_key = key + ":warm"
    jobs = cel.noop_jobs(key, n)
    counts_path = cfg.logdir / f"{broker}-counts.json"
    with cel.broker_state(broker, "profile", cfg) as run:
        env = {**run.env, "DELAYQ_PROFILE_COUNTS": str(counts_path),
               "PYTHONPATH": os.pathsep.join([str(HOOKS), run.env["PYTHONPATH"]])}
        with cel.running_worker(env, f"e2e-{broker}", cfg) as worker, \
                cel.Producers(run.env, cfg.producers) as producers:
            client = cel.counter_client(cfg)
            producers.submit(cel.publish, [("bench.noop", 200, (warm_key, 200), {})])
            while cel.count_of(client, warm_key) < 200:
                time.sleep(0.02)
            time.sleep(1.0)  # the counts file is rewritten every 0.5 s
            kids_p = [psutil.Process(p.pid) for p in producers.pool._pool]  # type: ignore[attr-defined]
            main = psutil.Process(worker.proc.pid)
            kids = main.children(recursive=True)
            server = ServerCpu(broker, cfg.admin_url)
            pg = PgStats(cfg.admin_url, run.db_url) if run.db_url else None
            counts0 = json.loads(counts_path.read_text()) if counts_path.exists() else {}
            c_prod = sum(_cpu(k) for k in kids_p)
            c_main, c_kids, t0 = _cpu(main), sum(_cpu(k) for k in kids), time.time()
            machine0 = _machine_busy()
            spies = _start_spies({"worker": main, "producer": kids_p[0]}, 120, cfg.logdir,
                                 broker) if pyspy else {}
            threads = cfg.producer_threads
            if threads > 1:
                producers.submit(cel.publish_threaded, [(threads, job) for job in jobs])
            else:
                producers.submit(cel.publish, jobs)
            while cel.count_of(client, key) < n and time.time() - t0 < 300:
                time.sleep(0.02)
            seconds = time.time() - t0
            out: dict[str, Any] = {
                "tasks_per_s": round(n / seconds, 1),
                "producers_cpu_us_per_task": round(
                    (sum(_cpu(k) for k in kids_p) - c_prod) * 1e6 / n),
                "worker_main_cpu_us_per_task": round((_cpu(main) - c_main) * 1e6 / n),
                "pool_children_cpu_us_per_task": round(
                    (sum(_cpu(k) for k in kids) - c_kids) * 1e6 / n),
                "server_cpu_us_per_task": round(server.used() * 1e6 / n),
                "machine_busy_us_per_task": round((_machine_busy() - machine0) * 1e6 / n)}
            out["unattributed_us_per_task"] = out["machine_busy_us_per_task"] - sum(
                out[k] for k in ("producers_cpu_us_per_task", "worker_main_cpu_us_per_task",
                                 "pool_children_cpu_us_per_task", "server_cpu_us_per_task"))
            if pg:
                out.update(pg.delta(n))
            out.update(_stop_spies(spies))
            time.sleep(1.0)
            if counts_path.exists():
                counts1 = json.loads(counts_path.read_text())
                out["worker_counts_per_task"] = {
                    k: round((v - counts0.get(k, 0)) / n, 3) for k, v in sorted(counts1.items())}
    return out


@click.command()
@click.option("--brokers", default="delayq,redis,amqp", show_default=True)
@click.option("--tasks", default=5000, show_default=True)
@click.option("--admin-url", default="postgresql://postgres@127.0.0.1:5499/postgres",
              show_default=True, help="A cluster with pg_stat_statements preloaded.")
@click.option("--py-spy", "pyspy", is_flag=True,
              help="Sample the worker main process (and, with --e2e, one producer).")
@click.option("--output", default="", help="Write the JSON results here.")
@click.option("--e2e", is_flag=True, help="Producers and worker together (throughput phase).")
@click.option("--producers", default=2, show_default=True, help="Producer processes (--e2e).")
@click.option("--producer-threads", default=1, show_default=True,
              help="Threads each producer process publishes from (--e2e).")
@click.option("--redis-db", default=11, show_default=True)
@click.option("--counter-db", default=12, show_default=True)
def main(brokers: str, tasks: int, admin_url: str, pyspy: bool, output: str, e2e: bool,
         producers: int, producer_threads: int, redis_db: int, counter_db: int) -> None:
    """Profile one producer and one worker per broker: CPU, statements, WAL per task."""
    cfg = cel.Settings.build(False, producers=producers if e2e else 1, admin_url=admin_url,
                            redis_db=redis_db, counter_db=counter_db,
                            producer_threads=producer_threads)
    results: dict[str, Any] = {"load_average_at_start": list(os.getloadavg())}
    try:
        for broker in brokers.split(","):
            if e2e:
                results[broker] = {"e2e": profile_e2e(broker, cfg, tasks, pyspy)}
            else:
                results[broker] = profile(broker, cfg, tasks, pyspy)
    finally:
        cel.kill_all()
        cel.cleanup_counters(cfg)
    results["load_average_at_end"] = list(os.getloadavg())
    text = json.dumps(results, indent=1)
    if output:
        Path(output).write_text(text)
    rows = []
    for broker in brokers.split(","):
        for step in ("e2e",) if e2e else ("publish", "drain"):
            r = results[broker][step]
            client_cpu = (f"{r['producers_cpu_us_per_task']} / {r['worker_main_cpu_us_per_task']}"
                          if step == "e2e" else r.get("producer_cpu_us_per_task",
                                                      r.get("worker_main_cpu_us_per_task")))
            rows.append([broker, step, str(r["tasks_per_s"]), str(client_cpu),
                         str(r.get("pool_children_cpu_us_per_task", "")),
                         str(r["server_cpu_us_per_task"]),
                         str(r.get("statements_per_task", "")),
                         str(r.get("exec_us_per_task", "")), str(r.get("wal_bytes_per_task", ""))])
    console.print(markdown_table(["broker", "step", "tasks/s", "client CPU us/task",
                                  "pool children us/task", "server CPU us/task", "statements/task",
                                  "statement exec us/task", "WAL B/task"], rows))
    console.print(text, markup=False, emoji=False, highlight=False)  # keys hold ":thread:"


if __name__ == "__main__":
    main()
