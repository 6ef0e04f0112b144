"""Spark pipeline benchmark (issue 5): bulk scheduling from a DataFrame vs ``apply_async``.

Schedules ``--rows`` tasks (default 1,000,000) from a DataFrame in Spark local mode with
``delayq_transport.spark.schedule_tasks`` — end to end: the Spark job, message building in
every partition and the inserts — then re-runs the same job (every row ``ignored``: the cost
of idempotency). Next to it, one Python process calls ``apply_async(eta=...)`` for the same
tasks (same name, arguments and ETAs) on the delayq broker and on Redis; those run for a
``--sample`` of calls and the time for ``--rows`` is extrapolated from their rate (said so in
the report). Writes ``bench/results/spark.json`` and the "Spark pipeline" section of
``docs/benchmarks.md`` (``--quick``: ``spark_quick.json``, docs untouched).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DEFAULT_ADMIN_URL,
    REPO_ROOT,
    console,
    fmt_rate,
    fresh_database,
    machine_info,
    markdown_table,
    progress_bar,
    replace_section,
    write_results,
)
from rich.progress import Progress, TaskID  # noqa: E402

TASK = "bench_spark.remind"
QUEUE = "bench_spark"
TARGET_ROWS_PER_S = 30_000
REDIS_URL = "redis://127.0.0.1:6379/15"
#: Untimed calls/rows before each measurement: connections, Python workers, prepared plans.
WARMUP_CALLS = 200
WARMUP_ROWS = 2_000
ETA_SPREAD_S = 86_400


def etas_base() -> datetime:
    """Tasks are due over the next day, starting tomorrow: a delayed queue's normal case."""
    return datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)


# -- Spark -------------------------------------------------------------------------------


def users(spark: Any, rows: int, partitions: int, base: datetime) -> Any:
    from pyspark.sql import functions as F

    return spark.range(rows, numPartitions=partitions).select(
        F.col("id").alias("user_id"),
        (F.lit(base) + F.make_interval(secs=F.col("id") % ETA_SPREAD_S)).alias("eta"),
        F.concat(F.lit("user"), F.col("id").cast("string"), F.lit("@example.com")).alias("email"),
    )


@contextmanager
def follow_stages(spark: Any, progress: Progress, task: TaskID) -> Iterator[None]:
    """Move the bar with finished Spark tasks (partitions); schedule_tasks is one call."""
    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.25):
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            finished = sum(s.numCompletedTasks for s in stages if s is not None)
            progress.update(task, completed=finished)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def spark_runs(url: str, rows: int, partitions: int, master: str, base: datetime,
               progress: Progress) -> dict[str, Any]:
    from delayq_transport.spark import local_session, schedule_tasks

    spark = local_session("delayq-bench-spark", master=master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        schedule = lambda df: schedule_tasks(  # noqa: E731
            df, TASK, "eta", args=["user_id"], kwargs={"email": "email"}, queue=QUEUE,
            database_url=url)
        schedule(users(spark, WARMUP_ROWS, 2, base - timedelta(days=30)))  # untimed warm-up
        df = users(spark, rows, partitions, base)
        runs = {}
        for name in ("first run", "re-run"):
            task = progress.add_task(f"Spark {name}", total=partitions, rate="",
                                     unit="partitions")
            with follow_stages(spark, progress, task):
                result = schedule(df)
            progress.update(task, completed=partitions,
                            rate=f"{fmt_rate(result.rows_per_s)} rows/s")
            runs[name] = result
    finally:
        spark.stop()
    first, again = runs["first run"], runs["re-run"]
    assert first.created == rows and again.ignored == rows, (first, again)
    return {"rows": rows, "partitions": partitions, "master": master,
            "seconds": first.elapsed_s, "rate": first.rows_per_s,
            "rerun_seconds": again.elapsed_s, "rerun_rate": again.rows_per_s,
            "created": first.created, "rerun_ignored": again.ignored}


# -- apply_async -------------------------------------------------------------------------


def producer(broker_url: str) -> Callable[..., Any]:
    from celery import Celery

    app = Celery("bench_spark", broker=broker_url, set_as_current=False)
    app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True,
                    enable_utc=True, timezone="UTC")

    @app.task(name=TASK)
    def remind(user_id: int, email: str) -> None:  # never run here: only published
        return None

    return remind.apply_async


def apply_async_run(label: str, broker_url: str, sample: int, rows: int, base: datetime,
                    progress: Progress) -> dict[str, Any]:
    """One process publishing ``sample`` tasks with ETAs; the rate extrapolates to ``rows``."""
    apply_async = producer(broker_url)

    def publish(i: int) -> None:
        apply_async((i,), {"email": f"user{i}@example.com"}, queue=QUEUE,
                    eta=base + timedelta(seconds=i % ETA_SPREAD_S))

    for i in range(WARMUP_CALLS):
        publish(rows + i)  # other ids than the measured ones
    task = progress.add_task(f"apply_async on {label}", total=sample, rate="", unit="calls")
    started = time.perf_counter()
    for i in range(sample):
        publish(i)
        if i % 500 == 499:
            spent = time.perf_counter() - started
            progress.update(task, completed=i + 1, rate=f"{fmt_rate((i + 1) / spent)} calls/s")
    seconds = time.perf_counter() - started
    progress.update(task, completed=sample, rate=f"{fmt_rate(sample / seconds)} calls/s")
    rate = sample / seconds
    return {"broker": label, "sample": sample, "seconds": seconds, "rate": rate,
            "extrapolated_seconds": rows / rate}


def delayq_apply_async(url: str, sample: int, rows: int, base: datetime,
                       progress: Progress) -> dict[str, Any]:
    try:
        import delayq_transport.transport  # noqa: F401  (registers delayq+postgresql://)
    except ImportError as exc:
        console.print(f"[yellow]delayq transport not importable, skipped: {exc}")
        return {"broker": "delayq", "skipped": str(exc)}
    return apply_async_run("delayq", "delayq+" + url, sample, rows, base, progress)


def redis_apply_async(redis_url: str, sample: int, rows: int, base: datetime,
                      progress: Progress) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return apply_async_run("Redis", redis_url, sample, rows, base, progress)
    finally:
        client.delete(QUEUE, f"_kombu.binding.{QUEUE}")  # only what this bench published


# -- report ------------------------------------------------------------------------------


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT,
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{rev} (with uncommitted changes)" if dirty else rev


def table_rows(data: dict[str, Any]) -> list[list[str]]:
    spark, rows = data["spark"], data["spark"]["rows"]
    out = [
        [f"Spark `schedule_tasks`, {spark['partitions']} partitions", f"{rows:,}",
         f"{spark['seconds']:.1f}", fmt_rate(spark["rate"]), "1.0×"],
        ["Spark re-run (every row `ignored`)", f"{rows:,}", f"{spark['rerun_seconds']:.1f}",
         fmt_rate(spark["rerun_rate"]), f"{spark['rerun_rate'] / spark['rate']:.2f}×"],
    ]
    for run in data["apply_async"]:
        if "skipped" in run:
            out.append([f"`apply_async(eta=...)` on {run['broker']}", "-", "-", "skipped", "-"])
            continue
        out.append([
            f"`apply_async(eta=...)` on {run['broker']}, 1 process",
            f"{run['sample']:,} (→ {rows:,} extrapolated)",
            f"{run['seconds']:.1f} (→ {run['extrapolated_seconds']:,.0f})",
            fmt_rate(run["rate"]), f"{run['rate'] / spark['rate']:.3f}×",
        ])
    return out


def ratios(data: dict[str, Any]) -> dict[str, float]:
    rate = data["spark"]["rate"]
    return {run["broker"]: rate / run["rate"] for run in data["apply_async"] if "rate" in run}


def markdown_section(data: dict[str, Any], results: Path) -> str:
    m, spark = data["machine"], data["spark"]
    pg = m["postgresql"]
    load = f"{data['load_average'][0]:.2f} at start, {data['load_average'][1]:.2f} at end"
    busy = max(data["load_average"]) > (m["cpu_count"] or 1) / 2
    met = "met" if spark["rate"] >= TARGET_ROWS_PER_S else "**not met**"
    speedups = ", ".join(f"{r:,.0f}× the rate of `apply_async` on {b}"
                         for b, r in ratios(data).items())
    table = markdown_table(["Method", "Rows", "Seconds", "Rows/s", "vs Spark"],
                           table_rows(data), align="lrrrr")
    where = ("storing the rows is not the main cost" if spark["rerun_rate"] < 1.5 * spark["rate"]
             else "storing the rows is a large share of the cost")
    return f"""## Spark pipeline

`python3 bench/bench_spark.py` schedules {spark['rows']:,} Celery tasks (one per row:
`args=[user_id]`, `kwargs={{"email": ...}}`, ETAs spread over the next day) from a DataFrame with
`schedule_tasks` in Spark local mode (`{spark['master']}`), end to end: the Spark job, building
each protocol-2 message in the partitions, and the multi-row inserts. It then runs the same
job again: every key already exists, so every row is `ignored` (idempotency's cost). Next to it,
one Python process calls `apply_async(eta=...)` for the same tasks on the delayq broker and on
Redis; those ran for a sample of calls and **the time for {spark['rows']:,} rows is extrapolated
from the sample's rate**. Raw figures: `{results.relative_to(REPO_ROOT)}`.

Run of {data['finished_at']}: {m['cpu_count']} × {m['cpu_model']}, PostgreSQL
{pg['server_version'].split()[0]} (`synchronous_commit={pg['synchronous_commit']}`),
Python {m['python']}, revision {data['git_revision']}, load average {load}.
{BUSY if busy else ""}
{table}

Target ≥ {TARGET_ROWS_PER_S:,} rows/s end to end: {met} ({fmt_rate(spark['rate'])} rows/s).
Spark scheduled at {speedups}.

**Where the time goes.** Per row, a partition builds the message in Python
(`task_message`, two JSON encodings, a content hash for the key), then PostgreSQL inserts a
~1 KB row into three indexes and the NOTIFY trigger's transition table. The re-run, whose
inserts all conflict and store nothing, ran at {spark['rerun_rate'] / spark['rate']:.2f}× the
first run's rate: {where}. On a 2-core machine Spark's JVM, the two Python workers and the
PostgreSQL backend share the two cores (with whatever else the machine is doing); executors
on more cores or machines scale the partition side. `apply_async` pays one round trip per
task and, on delayq, one committed transaction.
"""


BUSY = ("\n**The machine was busy during this run** (load average above half the cores): "
        "absolute rates are depressed and noisy; re-run on a quiet machine.\n")


# -- main --------------------------------------------------------------------------------


@click.command()
@click.option("--database-url", default=DEFAULT_ADMIN_URL, show_default=True,
              help="Admin connection; the bench creates and drops its own database.")
@click.option("--rows", type=click.IntRange(1), help="Rows scheduled by Spark [1,000,000; "
              "quick 100,000].")
@click.option("--sample", type=click.IntRange(1), help="apply_async calls per broker [20,000; "
              "quick 2,000].")
@click.option("--partitions", type=click.IntRange(1), default=8, show_default=True)
@click.option("--master", default="local[2]", show_default=True)
@click.option("--redis-url", default=REDIS_URL, show_default=True)
@click.option("--quick", is_flag=True, help="Smaller run (spark_quick.json, docs untouched).")
@click.option("--docs/--no-docs", "write_docs", default=None,
              help="Rewrite the docs/benchmarks.md section [default: unless --quick].")
def main(database_url: str, rows: int | None, sample: int | None, partitions: int, master: str,
         redis_url: str, quick: bool, write_docs: bool | None) -> None:
    """Spark bulk scheduling vs one process calling apply_async, on delayq and Redis."""
    rows = rows or (100_000 if quick else 1_000_000)
    sample = min(sample or (2_000 if quick else 20_000), rows)
    load_start = os.getloadavg()[0]
    base = etas_base()
    with fresh_database(database_url, prefix="delayq_bench_spark") as url, progress_bar() as bar:
        info = machine_info(url)
        spark = spark_runs(url, rows, partitions, master, base, bar)
        applied = [delayq_apply_async(url, sample, rows, base, bar),
                   redis_apply_async(redis_url, sample, rows, base, bar)]
    data = {"machine": info, "git_revision": git_revision(), "spark": spark,
            "apply_async": applied, "target_rows_per_s": TARGET_ROWS_PER_S,
            "load_average": [load_start, os.getloadavg()[0]]}
    path = write_results("spark_quick" if quick else "spark", data)
    data["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    console.print(f"wrote {path}")
    console.print(markdown_table(["Method", "Rows", "Seconds", "Rows/s", "vs Spark"],
                                 table_rows(data), align="lrrrr"))
    for broker, ratio in ratios(data).items():
        console.print(f"Spark / apply_async on {broker}: {ratio:,.1f}×")
    if (not quick) if write_docs is None else write_docs:
        console.print(f"wrote {replace_section('spark', markdown_section(data, path))}")


if __name__ == "__main__":
    main()
