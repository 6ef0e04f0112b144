"""Counts at size (issue 10, part 4): kombu's queue size, ``delayq status`` and a metrics
scrape against tables of 10k to 10M waiting rows, next to the exact counts they replaced.

Each size is a table of far-future rows plus a block of due rows (a backlog larger than the
count cap), loaded with generate_series. Every size is measured twice: with the planner
statistics wiped (what a table looks like right after a Spark bulk load, before autovacuum's
ANALYZE) and after ANALYZE. Operations run in interleaved rounds; medians are reported.

    flock /tmp/delayq-bench.lock python bench/bench_counts.py --rows 10000 --rows 10000000

``--reuse`` keeps the generated databases (``delayq_bench10b_counts_<rows>``) between runs
(10M rows take minutes to load); without it they are dropped at the end.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import click
import psycopg
from _common import (
    DEFAULT_ADMIN_URL,
    REPO_ROOT,
    TargetRow,
    command_line,
    git_revision,
    load_results,
    machine_info,
    markdown_table,
    prose,
    run_line,
    url_for,
    verdict,
    write_results,
)
from _targets import replace_section
from rich.console import Console

from delayq_transport import Database, DelayedQueue, migrate
from delayq_transport.core.inspect import check_health
from delayq_transport.metrics import render

console = Console()
FAR_MS = 86_400_000  # far rows are due a day (plus their index in ms) after the load

LOAD_SQL = """
INSERT INTO delayed_queue ("pKey", "pKind", payload, "scheduledAt", "scheduledAtInitially",
                           "createdAt")
SELECT lpad(g::text, 12, '0'), 'celery', '\\x00'::bytea, t, t, 0
FROM generate_series(1, %(n)s) AS g,
     LATERAL (SELECT CASE WHEN g <= %(due)s THEN now_ms - 1000 - g
                          ELSE now_ms + %(far_ms)s + g END AS t
              FROM (SELECT (extract(epoch FROM now()) * 1000)::bigint AS now_ms) AS c) AS s
"""


def _db_name(rows: int) -> str:
    return f"delayq_bench10b_counts_{rows}"


def build(admin_url: str, rows: int, due: int, reuse: bool) -> tuple[str, float | None]:
    """The database for one size; returns (url, seconds spent loading or None if reused)."""
    name = _db_name(rows)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists and reuse:
            return url_for(admin_url, name), None
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = url_for(admin_url, name)
    with Database(url) as db:
        migrate(db, "delayed_queue")
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE delayed_queue SET (autovacuum_enabled = false)")
        conn.execute("ALTER TABLE delayed_queue DISABLE TRIGGER USER")
        conn.execute(LOAD_SQL, {"n": rows + due, "due": due, "far_ms": FAR_MS})
        conn.execute("ALTER TABLE delayed_queue ENABLE TRIGGER USER")
    return url, time.perf_counter() - started


def wipe_statistics(url: str) -> None:
    """Back to "just bulk-loaded": no pg_statistic rows, reltuples unknown (superuser only)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM pg_statistic WHERE starelid = 'delayed_queue'::regclass")
        conn.execute("UPDATE pg_class SET reltuples = -1, relpages = 0 "
                     "WHERE oid = 'delayed_queue'::regclass")


def analyze(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE delayed_queue")


#: Whole processes timed at each size (median wall ms of ``PROCESS_ROUNDS`` runs each): what an
#: operator waits for, and the bare interpreter as the floor under it.
PROCESS_ROUNDS = 5


def process_ms(url: str) -> dict[str, float]:
    """Median wall ms of whole ``delayq status`` processes, table and ``--json``, and of
    ``python -c pass`` (interpreter start-up alone), interleaved."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT),
                                                       os.environ.get("PYTHONPATH", "")]),
               COLUMNS="200")
    runs = {
        "delayq status (process)": [sys.executable, "-m", "delayq_transport", "-d", url, "status"],
        "delayq status --json (process)": [sys.executable, "-m", "delayq_transport", "-d", url,
                                           "status", "--json"],
        "python -c pass (interpreter alone)": [sys.executable, "-c", "pass"],
    }
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(PROCESS_ROUNDS):
        for name, argv in runs.items():
            started = time.perf_counter()
            subprocess.run(argv, env=env, check=True, capture_output=True)
            samples[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(v) for name, v in samples.items()}


def measure(url: str, rounds: int, with_exact: bool) -> dict[str, float]:
    """Median milliseconds per operation over interleaved rounds."""
    with DelayedQueue(url, kind="celery", ensure_schema=False) as q:
        ops: dict[str, Callable[[], Any]] = {
            "queue size (count_due)": lambda: q.count_due(),
            "status (capped)": lambda: q.status(),
            "health (catalogs)": lambda: check_health(q.db, "delayed_queue"),
            "metrics scrape": lambda: render(q),
        }
        if with_exact:
            ops["old queue size (count_waiting)"] = lambda: q.count_waiting()
            ops["old status (exact)"] = lambda: q.status(exact=True)
        samples: dict[str, list[float]] = {name: [] for name in ops}
        for _ in range(rounds):
            for name, op in ops.items():
                started = time.perf_counter()
                op()
                samples[name].append((time.perf_counter() - started) * 1000)
        return {name: statistics.median(v) for name, v in samples.items()}


@click.command()
@click.option("--admin-url", default=DEFAULT_ADMIN_URL, show_default=True)
@click.option("--rows", "sizes", type=int, multiple=True, default=[10_000, 10_000_000],
              show_default=True, help="Far-future rows per table (repeat the option)")
@click.option("--due", type=int, default=200_000, show_default=True,
              help="Due rows added to each table (at most a tenth of --rows)")
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--exact-rounds", type=int, default=3, show_default=True,
              help="Rounds that also time the old exact counts (seconds each at 10M rows)")
@click.option("--reuse", is_flag=True, help="Keep and reuse the generated databases")
def main(admin_url: str, sizes: tuple[int, ...], due: int, rounds: int, exact_rounds: int,
         reuse: bool) -> None:
    load_before = os.getloadavg()
    results: list[dict[str, Any]] = []
    try:
        for rows in sizes:
            n_due = min(due, rows // 10)
            url, load_s = build(admin_url, rows, n_due, reuse)
            console.print(f"{rows} far + {n_due} due rows ready (load {load_s or 0:.0f}s)")
            for state, prepare in (("fresh load", wipe_statistics), ("analyzed", analyze)):
                prepare(url)
                medians = measure(url, exact_rounds, with_exact=True)
                medians.update(measure(url, rounds, with_exact=False))
                medians.update(process_ms(url))
                results.append({"rows": rows, "due": n_due, "state": state, "load_s": load_s,
                                "median_ms": medians})
                console.print(rows, state, {k: round(v, 1) for k, v in medians.items()})
    finally:
        if not reuse:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                for rows in sizes:
                    admin.execute(f'DROP DATABASE IF EXISTS "{_db_name(rows)}" WITH (FORCE)')
    load_after = os.getloadavg()
    data = {"command": command_line(), "revision": git_revision(),
            "machine": machine_info(admin_url), "loadavg_before": load_before,
            "loadavg_after": load_after, "results": results}
    write_results("counts", data)
    replace_section("counts", section(load_results("counts")))


def _rows_label(r: dict[str, Any]) -> str:
    def short(n: int) -> str:
        return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"

    return f"{short(r['rows'])} + {short(r['due'])} due, {r['state']}"


def section(data: dict[str, Any]) -> str:
    """The "Counts at size" section of docs/benchmarks.md from a results document."""
    results = data["results"]
    ops = list(results[0]["median_ms"])
    table = markdown_table(
        ["operation (median ms)"] + [_rows_label(r) for r in results],
        [[op] + [f"{r['median_ms'][op]:.1f}" for r in results] for op in ops],
        "l" + "r" * len(results))
    command = data.get("command", "python bench/bench_counts.py --rows 10000 --rows 10000000")
    load = (data["loadavg_before"][0], data["loadavg_after"][0])
    how = prose("""
kombu's queue size (asked at every worker start), `delayq status` and a metrics scrape on far-
future rows plus a due backlog, next to the exact counts they replaced; "fresh load": planner
statistics wiped, as after a bulk load. A bounded count reads at most the cap's worth (100,000)
of index entries, so from 1M rows on it no longer grows with the table. The *process* rows are
whole `python -m delayq_transport` runs.""")
    return f"""## Counts at size

{run_line(command, data.get("revision"), data.get("finished_at"), data.get("machine"), load)}

{table}

{how}
"""


#: What an operator waits for at the largest size: the queue size, `delayq status`'s
#: statements and the whole `delayq status` process, each under this many ms.
TARGET_MS = 1000.0
TARGET_OPS = ("queue size (count_due)", "status (capped)")
PROCESS_OP = "delayq status (process)"


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """This run's row of the page's "Targets at a glance": the largest size, either state."""
    largest = max(r["rows"] for r in data["results"])
    runs = [r["median_ms"] for r in data["results"] if r["rows"] == largest]
    statements = [run[op] for run in runs for op in TARGET_OPS]
    process = max(run[PROCESS_OP] for run in runs)
    ok = max(round(v, 1) for v in [*statements, process]) < TARGET_MS
    return [TargetRow(
        "scale", f"queue size and `delayq status` < {TARGET_MS / 1000:g} s at "
        f"{largest:,} rows", f"statements {min(statements):.1f}–{max(statements):.1f} ms, the "
        f"whole `delayq status` process {process:.1f} ms", verdict(ok))]


if __name__ == "__main__":
    main()
