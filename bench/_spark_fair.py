"""``schedule_tasks`` against one process COPYing the same rows, interleaved in rounds.

Measured one after the other, the COPY reference alone moved from 43,067 to 63,420 rows/s over
three runs of one afternoon and ``schedule_tasks`` from 28,943 to 41,328: a single pair cannot
tell a regression from noise. So each round runs the raw COPY (one process, a session kept
open across rounds, so it is warm from the second round on: the first round's COPY is run but
not counted), ``schedule_tasks`` with keys only and ``schedule_tasks`` with a ``run_id`` (the
run ledger), each into an empty table after a CHECKPOINT, in an order that rotates per round;
the report gives each one's median and the median over rounds of each ``schedule_tasks`` rate
divided by the same round's COPY rate. Used by ``bench_spark.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg import sql

MODES = ("copy", "keys", "run_id")


def _empty(url: str, tables: Iterable[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for table in tables:
            conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))


def fair_rounds(df: Any, rows: int, schedule: Callable[..., Any], url: str, rounds: int,
                copy_table: str, chunks: Callable[[], Iterable[bytes]],
                checkpoint: Callable[[], None], log: Callable[[str], None]) -> dict[str, Any]:
    """``rounds`` rounds of the three modes (plus an uncounted first one); rows/s per round,
    medians, and the median of the per-round ratios to COPY."""
    from delayq_transport.core.db import Database
    from delayq_transport.core.integrations import copy_direct

    rates: dict[str, list[float]] = {m: [] for m in MODES}
    with Database(url, max_size=1) as db:  # the COPY's session, warm after the first round

        def copy() -> float:
            spent = 0.0
            for chunk in chunks():  # built untimed
                started = time.perf_counter()
                copy_direct(db, copy_table, [chunk])
                spent += time.perf_counter() - started
            return rows / spent

        def job(mode: str, r: int) -> float:
            _empty(url, ("delayed_queue", "delayed_queue__runs", copy_table))
            checkpoint()
            if mode == "copy":
                return copy()
            result = schedule(df, run_id=f"bench-fair-{r}" if mode == "run_id" else None)
            assert (result.created, result.bad, result.skipped) == (rows, 0, 0), result
            return float(result.rows_per_s)

        for r in range(rounds + 1):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            got = {mode: job(mode, r) for mode in order}
            log(f"round {r}{' (warm-up, not counted)' if r == 0 else ''}: "
                + ", ".join(f"{m} {v:,.0f}" for m, v in got.items()) + " rows/s")
            if r:
                for mode, rate in got.items():
                    rates[mode].append(rate)
    _empty(url, ("delayed_queue", "delayed_queue__runs", copy_table))
    return {"rows": rows, "rounds": rounds, "rates": rates,
            "median": {m: statistics.median(v) for m, v in rates.items()},
            "ratio": {m: statistics.median(a / c for a, c in zip(rates[m], rates["copy"],
                                                                  strict=True))
                      for m in ("keys", "run_id")}}
