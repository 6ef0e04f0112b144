"""CPU per task of each process of a Celery benchmark run, so a rate comes with its cause.

:class:`ServerCpu` is the broker's server side; :class:`CpuMeter` takes every side at once
(producer processes, the worker's main process, its pool children, the broker server and, for
PostgreSQL, the cluster's own background processes) between :meth:`CpuMeter.start` and
:meth:`CpuMeter.per_task`. Used by ``bench_celery.py``'s throughput phases and by its sweep
phase, which is here: producer processes x workers, read by the CPU each side used.
"""

from __future__ import annotations

import uuid
from typing import Any

import psutil
import psycopg
from _celery import (
    BrokerRun,
    Producers,
    Settings,
    Worker,
    count_of,
    counter_client,
    counter_key,
    noop_jobs,
    publish,
    wait_count,
)
from _common import checkpoint, cpu_seconds, tree_cpu

#: PostgreSQL's own processes whose work follows from the load (what a relaxed commit hands
#: to the WAL writer, dirty buffers, checkpoints), counted apart from the backends.
PG_AUX = ("walwriter", "checkpointer", "background writer")


def _procs(pids: list[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return procs


class ServerCpu:
    """CPU seconds of the broker's server side: for PostgreSQL-backed brokers the backends
    serving this phase's database (found by name in pg_stat_activity, so other users of a
    shared server are not counted), RabbitMQ's ``beam.smp``, ``redis-server``; with ``aux``,
    the PostgreSQL cluster's WAL writer, checkpointer and background writer instead (shared by
    every database: on a busy server they count others' work too). A process started
    meanwhile counts from zero."""

    def __init__(self, run: Any, admin_url: str, *, aux: bool = False) -> None:
        self.run, self.admin_url, self.aux = run, admin_url, aux
        self.start = {p.pid: cpu_seconds(p) for p in self._procs()}

    def _procs(self) -> list[psutil.Process]:
        if self.run.db_url is not None:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                if self.aux:
                    rows = conn.execute("SELECT pid FROM pg_stat_activity"
                                        " WHERE backend_type = ANY(%s)", (list(PG_AUX),))
                else:
                    dbname = self.run.db_url.rsplit("/", 1)[1]
                    rows = conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> "
                        "pg_backend_pid()", (dbname,))
                return _procs([r[0] for r in rows])
        if self.aux:
            return []
        name = "redis-server" if self.run.name == "redis" else "beam.smp"
        return [p for p in psutil.process_iter(["name"]) if p.info["name"] == name]

    def used(self) -> float:
        return sum(cpu_seconds(p) - self.start.get(p.pid, 0.0) for p in self._procs())


def _children_cpu(pid: int) -> float:
    try:
        return sum(cpu_seconds(c) for c in psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return 0.0


class CpuMeter:
    """CPU seconds used from :meth:`start` on by each side of one run."""

    def __init__(self, run: Any, admin_url: str, producer_pids: list[int],
                 worker_pid: int) -> None:
        self.run, self.admin_url = run, admin_url
        self.producer_pids, self.worker_pid = producer_pids, worker_pid

    def start(self) -> None:
        self.server = ServerCpu(self.run, self.admin_url)
        self.aux = ServerCpu(self.run, self.admin_url, aux=True)
        self.t0 = self._local()

    def _local(self) -> tuple[float, float, float]:
        if self.worker_pid <= 0:  # no worker (a diagnostic measuring producers alone)
            return tree_cpu(self.producer_pids), 0.0, 0.0
        main = _procs([self.worker_pid])
        return (tree_cpu(self.producer_pids), cpu_seconds(main[0]) if main else 0.0,
                _children_cpu(self.worker_pid))

    def per_task(self, n: int) -> dict[str, Any]:
        """µs of CPU per task of each side (``pg_aux_us``: None for a broker without it)."""
        producers, main, pool = (b - a for a, b in zip(self.t0, self._local(), strict=True))
        server, aux = self.server.used(), self.aux.used()
        us = {"producers_us": producers, "worker_main_us": main, "worker_pool_us": pool,
              "server_us": server, "pg_aux_us": aux if self.run.db_url else None}
        return {k: None if v is None else round(v * 1e6 / n) for k, v in us.items()}


#: The sweep's grid: producer processes x worker processes (each worker ``-c 2``).
SWEEP_PRODUCERS = (1, 2, 4)
SWEEP_WORKERS = (1, 2, 4)


def _sweep_point(run: BrokerRun, cfg: Settings, progress: Any, workers: list[Worker],
                 producers: int, n: int) -> dict[str, Any]:
    key = counter_key(cfg, run.name, "sweep", uuid.uuid4().hex[:8])
    jobs = noop_jobs(key, n)
    with Producers(run.env, producers) as pool:
        producer_pids = pool.pids()
        worker_pids = [w.proc.pid for w in workers]
        server = ServerCpu(run, cfg.admin_url)
        cpu0 = (tree_cpu(worker_pids), tree_cpu(producer_pids))
        psutil.cpu_percent()
        done = pool.submit(publish, jobs)
        ran = progress.add_task(f"{run.name}: {producers}P x {len(workers)}W", total=n,
                                rate="", unit="tasks")
        executed = wait_count(cfg, key, n, max(180.0, n / 20), progress, ran, count_of)
        busy = psutil.cpu_percent()
        done_at = counter_client(cfg).get(f"{key}:done")
        server_s = server.used()
        worker_s = tree_cpu(worker_pids) - cpu0[0]
        producer_s = tree_cpu(producer_pids) - cpu0[1]
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
