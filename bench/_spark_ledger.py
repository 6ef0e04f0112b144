"""What a run id costs ``schedule_tasks`` (issue 29), measured inside ``bench_spark.py``.

The same DataFrame is scheduled without a run id (keys only: one autocommit merge per chunk)
and with one (each partition one transaction with its run-ledger entry, key hashes computed
in the JVM for the part's fingerprint, the driver's prune, ledger read and whole-run record),
alternating which goes first, into an empty queue table each time (and an empty ledger), with
a CHECKPOINT before every job so neither pays the other's dirty pages, after one untimed job
of each (timed, the first run_id job spent 4.2 s of Spark CPU against 2.5-2.8 s for the later
ones: Spark compiles its new projection). Two sizes: the bulk job, and a job of one stream
micro-batch's size, where the fixed per-run costs show (every ``schedule_stream`` batch is
such a run).

Besides rows/s, each job's CPU seconds on the Spark side (the JVM and its Python workers,
:func:`spark_cpu_s`) are recorded: on a shared 2-core machine the wall-clock rate of identical
jobs moves by 10-20 %, the CPU they burn much less.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import psutil
import psycopg
from psycopg import sql

MODES = ("keys", "run_id")


def _empty(url: str, tables: tuple[str, ...]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for table in tables:
            conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))


def spark_cpu_s(spark: Any) -> float:
    """User + system CPU seconds of the Spark driver JVM (local mode: the executors too) and
    every process under it (the Python daemon and workers)."""
    jvm = psutil.Process(spark.sparkContext._gateway.proc.pid)
    total = 0.0
    for proc in [jvm, *jvm.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def ledger_ab(df: Any, rows: int, schedule: Callable[..., Any], url: str, rounds: int,
              checkpoint: Callable[[], None], cpu: Callable[[], float],
              label: str) -> dict[str, Any]:
    """``rounds`` pairs of jobs: each mode's rows/s and Spark CPU seconds, their medians, and
    the median over pairs of run_id / keys (rate, and CPU)."""
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    cpus: dict[str, list[float]] = {m: [] for m in MODES}

    def job(mode: str, run_id: str) -> tuple[float, float]:
        _empty(url, ("delayed_queue", "delayed_queue__runs"))
        checkpoint()
        before = cpu()
        result = schedule(df, run_id=run_id if mode == "run_id" else None)
        assert (result.created, result.bad, result.skipped) == (rows, 0, 0), result
        return result.rows_per_s, cpu() - before

    for mode in MODES:  # untimed: the run_id plan's generated code is new to the JVM
        job(mode, f"bench-{label}-warmup")
    for r in range(rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            rate, spent = job(mode, f"bench-{label}-{r}")
            rates[mode].append(rate)
            cpus[mode].append(spent)

    def pairs(values: dict[str, list[float]]) -> float:
        return statistics.median(b / a for a, b in zip(values["keys"], values["run_id"],
                                                       strict=True))

    return {"rows": rows, "rounds": rounds, "rates": rates, "spark_cpu_s": cpus,
            "median": {m: statistics.median(v) for m, v in rates.items()},
            "ratio": pairs(rates), "cpu_ratio": pairs(cpus)}
