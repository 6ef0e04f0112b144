"""Spark pipeline benchmark (issues 5 and 13): bulk scheduling measured against raw COPY.

One run reports, on one fresh database:

1. **the raw COPY limit**: one Python process binary-COPYing ``--rows`` ready messages (the
   same tasks, built beforehand, untimed) straight into a queue table with its indexes and
   trigger; and the same rows through ``core.integrations.BulkWriter`` (COPY into a TEMP table, one
   ``INSERT ... ON CONFLICT`` merge per 50,000 rows), which ``schedule_tasks`` uses;
2. ``schedule_tasks`` end to end (job start to return) on ``--master``, first run and re-run
   (every row ``ignored``), counts checked exactly;
   then the same jobs without and with a ``run_id`` (the run ledger of issue 29), in
   ``--ledger-rounds`` alternating pairs, at the bulk size and at one micro-batch's size
   (``_spark_ledger.py``);
3. ``schedule_stream`` over ``--stream-rows`` rows in 20 parquet files (file source, 4 files
   per micro-batch, ``availableNow``; every batch a run of the ledger);
4. ``queue_dataframe`` over a ``--read-rows`` table (filled server-side, untimed): one full
   read, and the three reports of ``delayq spark-report``;
5. ``apply_async(eta=...)`` in one process on delayq and on Redis for reference (a sample;
   rates only).

Rates are given as ratios to the raw COPY limit of the same run. Writes
``bench/results/spark.json``, ``docs/img/bench_spark.png`` and the "Spark pipeline" section of
``docs/benchmarks.md`` (``--quick``: ``spark_quick.json``, docs untouched).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import psycopg
from _common import (
    DEFAULT_ADMIN_URL,
    IMG_DIR,
    TargetRow,
    at_least,
    checkpoint,
    command_line,
    console,
    fmt_rate,
    fresh_database,
    git_revision,
    grouped_bar_chart,
    load_results,
    machine_info,
    markdown_table,
    prose,
    run_line,
    times,
    verdict,
    write_results,
)
from _spark_fair import fair_rounds
from _spark_ledger import ledger_ab, spark_cpu_s
from _targets import replace_section
from psycopg import sql

TASK = "bench_spark.remind"
QUEUE = "bench_spark"
REDIS_URL = "redis://127.0.0.1:6379/15"
#: ``schedule_tasks`` with its run ledger against one process COPYing the same rows, the
#: median over interleaved rounds (``_spark_fair.py``).
TARGET_RATIO = 0.8
ETA_SPREAD_S = 86_400
WARMUP_ROWS = 20_000
CHUNK_ROWS = 50_000
#: Parquet files per micro-batch: one file is one partition, so a batch of one file would
#: leave one of the two cores without a writer.
FILES_PER_BATCH = 4
PLOT = IMG_DIR / "bench_spark.png"


def etas_base() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def truncate(url: str, table: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))


# -- 1. the COPY limit ----------------------------------------------------------------------


def message_chunks(rows: int, base: datetime, now_ms: int, *, direct: bool) -> Iterator[bytes]:
    """The benchmark's tasks as binary COPY tuples, ``CHUNK_ROWS`` at a time."""
    from delayq_transport.core.integrations import copy_record, direct_record
    from delayq_transport.spark.rows import default_key, encoder

    enc = encoder(TASK, QUEUE, None, "bench")
    base_ms = int(base.timestamp() * 1000)
    for start in range(0, rows, CHUNK_ROWS):
        parts = []
        for i in range(start, min(start + CHUNK_ROWS, rows)):
            at = base_ms + (i % ETA_SPREAD_S) * 1000
            args, kwargs = [i], {"email": f"user{i}@example.com"}
            key = default_key(TASK, args, kwargs, at)
            eta = datetime.fromtimestamp(at / 1000, UTC)
            payload = enc.encode(args, kwargs, task_id=key, eta=eta, delivery_tag=key)
            parts.append(direct_record(key, QUEUE, payload, at, now_ms) if direct
                         else copy_record(key, QUEUE, payload, at))
        yield b"".join(parts)


def copy_limit(url: str, rows: int, base: datetime) -> dict[str, Any]:
    """Only the COPY calls are timed; building the messages is not."""
    from delayq_transport import DelayedQueue
    from delayq_transport.core.db import Database
    from delayq_transport.core.integrations import BulkWriter, copy_direct

    out: dict[str, Any] = {}
    for table in ("bench_copy", "bench_merge"):
        DelayedQueue(url, table=table, pool_max_size=1).close()
    now_ms = int(time.time() * 1000)
    with Database(url, max_size=1) as db:
        spent = 0.0
        for chunk in message_chunks(rows, base, now_ms, direct=True):
            spent += timed(functools.partial(copy_direct, db, "bench_copy", [chunk]))[0]
        out["copy_seconds"], out["copy_rate"] = spent, rows / spent
        spent, created = 0.0, 0
        with BulkWriter(db, table="bench_merge") as writer:
            for chunk, n in zip(message_chunks(rows, base, now_ms, direct=False),
                                _chunk_sizes(rows), strict=True):
                spent += timed(functools.partial(writer.write, chunk, n))[0]
            spent += timed(writer.flush)[0]
            created = writer.counts.created
        assert created == rows, created
        out["merge_seconds"], out["merge_rate"] = spent, rows / spent
    for table in ("bench_copy", "bench_merge"):
        truncate(url, table)
    console.print(f"COPY limit {fmt_rate(out['copy_rate'])} rows/s; staged + merged "
                  f"{fmt_rate(out['merge_rate'])} rows/s")
    return out


def _chunk_sizes(rows: int) -> Iterator[int]:
    for start in range(0, rows, CHUNK_ROWS):
        yield min(CHUNK_ROWS, rows - start)


# -- 2-4. Spark -------------------------------------------------------------------------------


def users(spark: Any, rows: int, partitions: int, base: datetime) -> Any:
    from pyspark.sql import functions as F

    return spark.range(rows, numPartitions=partitions).select(
        F.col("id").alias("user_id"),
        (F.lit(base) + F.make_interval(secs=F.col("id") % ETA_SPREAD_S)).alias("eta"),
        F.concat(F.lit("user"), F.col("id").cast("string"), F.lit("@example.com")).alias("email"),
    )


def schedule_with(url: str) -> Callable[..., Any]:
    from delayq_transport.spark import schedule_tasks

    def schedule(df: Any, task: str = TASK, run_id: str | None = None) -> Any:
        return schedule_tasks(df, task, "eta", args=["user_id"], kwargs={"email": "email"},
                              queue=QUEUE, database_url=url, run_id=run_id)

    return schedule


def schedule_runs(spark: Any, url: str, rows: int, partitions: int,
                  base: datetime) -> dict[str, Any]:
    schedule = schedule_with(url)
    schedule(users(spark, WARMUP_ROWS, 2, base), task=TASK + ".warmup")  # JIT, workers
    df = users(spark, rows, partitions, base)
    first = schedule(df)
    console.print(f"schedule_tasks first run {fmt_rate(first.rows_per_s)} rows/s")
    again = schedule(df)
    console.print(f"schedule_tasks re-run {fmt_rate(again.rows_per_s)} rows/s")
    assert (first.created, first.ignored, first.bad) == (rows, 0, 0), first
    assert (again.created, again.ignored, again.bad) == (0, rows, 0), again
    return {"rows": rows, "partitions": partitions, "seconds": first.elapsed_s,
            "rate": first.rows_per_s, "rerun_seconds": again.elapsed_s,
            "rerun_rate": again.rows_per_s}


def fair_runs(spark: Any, url: str, admin_url: str, rows: int, partitions: int,
              base: datetime, rounds: int) -> dict[str, Any]:
    """COPY, keys only and run_id interleaved in rounds (``_spark_fair.py``)."""
    now_ms = int(time.time() * 1000)
    out = fair_rounds(users(spark, rows, partitions, base), rows, schedule_with(url), url,
                      rounds, "bench_copy",
                      lambda: message_chunks(rows, base, now_ms, direct=True),
                      lambda: checkpoint(admin_url), console.print)
    console.print(f"interleaved, medians of {rounds} rounds: COPY "
                  f"{fmt_rate(out['median']['copy'])}, schedule_tasks "
                  f"{out['ratio']['keys']:.2f}x, with run_id {out['ratio']['run_id']:.2f}x")
    return out


def ledger_runs(spark: Any, url: str, admin_url: str, sizes: dict[str, tuple[int, int]],
                base: datetime, rounds: int) -> dict[str, Any]:
    """Without vs with a run id, per size (rows, partitions)."""
    out = {}
    for label, (rows, partitions) in sizes.items():
        out[label] = ab = ledger_ab(users(spark, rows, partitions, base), rows,
                                    schedule_with(url), url, rounds,
                                    lambda: checkpoint(admin_url), lambda: spark_cpu_s(spark),
                                    label)
        console.print(f"{label} ({rows:,} rows): keys only {fmt_rate(ab['median']['keys'])}, "
                      f"run_id {fmt_rate(ab['median']['run_id'])} rows/s; run_id/keys over "
                      f"{rounds} pairs: rate {ab['ratio']:.3f}x, Spark CPU {ab['cpu_ratio']:.3f}x")
    return out


def stream_run(spark: Any, url: str, rows: int, files: int, base: datetime) -> dict[str, Any]:
    from delayq_transport.spark import schedule_stream

    work = Path(tempfile.mkdtemp(prefix="delayq_bench13_"))
    try:
        src = str(work / "in")
        users(spark, rows, files, base + timedelta(days=2)).write.parquet(src)  # untimed
        stream = (spark.readStream.schema("user_id long, eta timestamp, email string")
                  .option("maxFilesPerTrigger", FILES_PER_BATCH).parquet(src))
        started = time.perf_counter()
        handle = schedule_stream(stream, TASK, "eta", args=["user_id"],
                                 kwargs={"email": "email"}, queue=QUEUE, database_url=url,
                                 checkpoint_location=str(work / "checkpoint"),
                                 trigger={"availableNow": True})
        assert handle.query is not None
        handle.query.awaitTermination()
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert (handle.created, handle.bad) == (rows, 0), handle
    console.print(f"schedule_stream {fmt_rate(rows / seconds)} rows/s ({handle.batches} batches)")
    return {"rows": rows, "batches": handle.batches, "seconds": seconds, "rate": rows / seconds}


def fill_read_table(url: str, table: str, rows: int) -> float:
    """``rows`` small Celery-shaped messages, built by PostgreSQL (untimed in the read rate)."""
    from delayq_transport import DelayedQueue

    DelayedQueue(url, table=table, pool_max_size=1).close()
    payload = ('{"body": "", "headers": {"lang": "py", "task": "bench.read.t', "\"}}")
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(
            'INSERT INTO {} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", '
            '"createdAt") SELECT i::text, %s, convert_to(%s || (i %% 7)::text || %s, \'UTF8\'), '
            "%s + (i %% 86400) * 1000, %s + (i %% 86400) * 1000, %s "
            "FROM generate_series(1, %s) AS i").format(sql.Identifier(table)),
            (QUEUE, payload[0], payload[1], int(time.time() * 1000) + 3_600_000,
             int(time.time() * 1000) + 3_600_000, int(time.time() * 1000), rows))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
    return time.perf_counter() - started


def read_runs(spark: Any, url: str, rows: int, partitions: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from delayq_transport.spark import queue_dataframe, queue_report

    table = "bench_read"
    fill_s = fill_read_table(url, table, rows)
    df = queue_dataframe(spark, url, table, num_partitions=partitions)
    seconds, agg = timed(lambda: df.agg(F.count(F.lit(1)).alias("n"),
                                        F.countDistinct("task").alias("tasks"),
                                        F.max("scheduled_at").alias("last")).collect()[0])
    assert agg.n == rows and agg.tasks == 7, agg
    console.print(f"queue_dataframe read {fmt_rate(rows / seconds)} rows/s")
    report_s, report = timed(lambda: queue_report(df))
    assert report.rows == rows, report.rows
    console.print(f"spark-report reports in {report_s:.1f} s")
    return {"rows": rows, "partitions": partitions, "fill_seconds": fill_s, "seconds": seconds,
            "rate": rows / seconds, "report_seconds": report_s}


# -- 5. apply_async --------------------------------------------------------------------------


def apply_async_rate(broker_url: str, sample: int, base: datetime) -> float:
    from celery import Celery

    app = Celery("bench_spark", broker=broker_url, set_as_current=False)
    app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True,
                    enable_utc=True, timezone="UTC")

    @app.task(name=TASK)
    def remind(user_id: int, email: str) -> None:
        return None

    def publish(i: int) -> None:
        remind.apply_async((i,), {"email": f"user{i}@example.com"}, queue=QUEUE,
                           eta=base + timedelta(days=5, seconds=i % ETA_SPREAD_S))

    for i in range(200):
        publish(10**9 + i)
    seconds, _ = timed(lambda: [publish(i) for i in range(sample)])  # type: ignore[func-returns-value]
    return sample / seconds


def apply_async_runs(url: str, redis_url: str, sample: int, base: datetime) -> dict[str, float]:
    import redis

    import delayq_transport.transport  # noqa: F401  (registers delayq+postgresql://)

    rates = {"delayq": apply_async_rate("delayq+" + url, sample, base)}
    try:
        rates["Redis"] = apply_async_rate(redis_url, sample, base)
    finally:
        redis.Redis.from_url(redis_url).delete(QUEUE, f"_kombu.binding.{QUEUE}")
    console.print(", ".join(f"apply_async on {b} {fmt_rate(r)}/s" for b, r in rates.items()))
    return rates


# -- report ------------------------------------------------------------------------------------


def result_rows(data: dict[str, Any]) -> list[list[str]]:
    limit = data["copy"]["copy_rate"]
    s, st, rd = data["schedule"], data["stream"], data["read"]
    fair = data.get("fair")

    def row(label: str, rows: int | str, seconds: float | str, rate: float) -> list[str]:
        secs = f"{seconds:.1f}" if isinstance(seconds, float) else seconds
        count = f"{rows:,}" if isinstance(rows, int) else rows
        return [label, count, secs, fmt_rate(rate), times(rate / limit)]

    return [
        row("Raw binary COPY into the queue table, 1 process (the limit)", s["rows"],
            data["copy"]["copy_seconds"], limit),
        row("COPY into a TEMP table + one merge per 50,000 rows, 1 process", s["rows"],
            data["copy"]["merge_seconds"], data["copy"]["merge_rate"]),
        row(f"Spark `schedule_tasks`, first run ({data['master']}, {s['partitions']} "
            "partitions)", s["rows"], s["seconds"], s["rate"]),
        row("Spark `schedule_tasks`, re-run (every row `ignored`)", s["rows"],
            s["rerun_seconds"], s["rerun_rate"]),
        *([[f"Interleaved, {fair['rounds']} rounds: {what} (median)", f"{fair['rows']:,}",
            "-", fmt_rate(fair["median"][mode]),
            times(1.0) if mode == "copy" else f"{times(fair['ratio'][mode])} (per round)"]
           for mode, what in (("copy", "raw COPY, 1 process, warm session"),
                              ("keys", "Spark `schedule_tasks`, keys only"),
                              ("run_id", "Spark `schedule_tasks` with a `run_id`"))]
          if fair else []),
        *[row(f"Spark `schedule_tasks`, {label} size, {mode} (median of "
              f"{ab['rounds']})", ab["rows"], "-", ab["median"][mode])
          for label, ab in data.get("ledger", {}).items() for mode in ("keys", "run_id")],
        row(f"Spark `schedule_stream`, {st['batches']} micro-batches", st["rows"], st["seconds"],
            st["rate"]),
        row(f"Spark `queue_dataframe` full read, {rd['partitions']} partitions", rd["rows"],
            rd["seconds"], rd["rate"]),
        *[row(f"`apply_async(eta=...)` on {b}, 1 process (sample)", f"{data['sample']:,}", "-",
              r) for b, r in data["apply_async"].items()],
    ]


def plot(data: dict[str, Any]) -> Path:
    rows = result_rows(data)
    labels = ["COPY limit", "COPY+merge", "schedule_tasks", "re-run",
              *[f"{label}\n{mode}" for label in data.get("ledger", {})
                for mode in ("keys", "run_id")],
              "stream", "read", *[f"apply_async\n{b}" for b in data["apply_async"]]]
    rows = [r for r in rows if not r[0].startswith("Interleaved")]
    rates = [float(r[3].replace(",", "")) for r in rows]
    return grouped_bar_chart(PLOT, labels, {"rows/s": rates},
                             title="Spark pipeline: rows per second (one run)",
                             ylabel="rows/s", log_scale=True)


def ledger_text(data: dict[str, Any]) -> str:
    """What a run id cost in this run, per size."""
    parts = [f"{label} ({ab['rows']:,} rows): rate {times(ab['ratio'])}, Spark CPU "
             f"{times(ab['cpu_ratio'])}" for label, ab in data.get("ledger", {}).items()]
    if not parts:
        return ""
    return ("\n**Run ids** (the run ledger): the same job without and with a "
            "`run_id`, alternating, into an empty table each time; run_id / keys only, median "
            f"over {next(iter(data['ledger'].values()))['rounds']} pairs: "
            + "; ".join(parts) + ".\n")


def target_check(data: dict[str, Any]) -> tuple[bool | None, str]:
    """The target (None: not measured in this run) and the figures it is judged on."""
    s = data["schedule"]
    limit = data["copy"]["copy_rate"]
    ratio, rerun_ratio = s["rate"] / limit, s["rerun_rate"] / limit
    fair = data.get("fair")
    if fair:  # the target's measure: interleaved rounds, with the run ledger
        ratio = fair["ratio"]["run_id"]
        return (at_least(ratio, TARGET_RATIO) and s["rerun_rate"] >= s["rate"],
                f"{times(ratio)}, re-run {times(rerun_ratio)}")
    return None, f"first run {times(ratio)} the one COPY, re-run {times(rerun_ratio)}"


TARGET_TEXT = (f"`schedule_tasks` with its run ledger ≥ {TARGET_RATIO}× one process COPYing "
               "the same rows, interleaved, and the re-run at least as fast")


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """This run's row of the page's "Targets at a glance"."""
    ok, figures = target_check(data)
    return [TargetRow("Spark", TARGET_TEXT, figures,
                      verdict(ok, "not measured: no interleaved rounds in this run"))]


def section(data: dict[str, Any]) -> str:
    """The "Spark pipeline" section of docs/benchmarks.md from a results document."""
    fair = data.get("fair")
    ok, figures = target_check(data)
    if ok is None:
        verdict = f"not measured in this run, which has no interleaved rounds ({figures})"
    else:
        verdict = f"{'met' if ok else '**not met**'} ({figures})"
    table = markdown_table(["What", "Rows", "Seconds", "Rows/s", "vs COPY limit"],
                           result_rows(data), align="lrrrr")
    loads = data["load_average"]
    command = data.get("command", "python bench/bench_spark.py")
    interleaved = ("The interleaved rows run the raw COPY, `schedule_tasks` and `schedule_tasks` "
                   "with a `run_id` in turn, in rotating order, each into an empty table after a "
                   "CHECKPOINT, after one uncounted round (`bench/_spark_fair.py`); their ratio "
                   "is the median of the per-round ratios. ") if fair else ""
    how = prose(f"""
The limit is one Python process binary-COPYing ready messages (built untimed) into a queue table
with its indexes and trigger; `schedule_tasks` runs end to end, job start to return, its counts
checked exactly. The JVM, the Python workers and PostgreSQL share the 2 cores, so compare the
ratios to the COPY limit of the same run. {interleaved}Target: {TARGET_TEXT}: {verdict}.""")
    return f"""## Spark pipeline

{run_line(command, data.get("git_revision"), data.get("finished_at"), data["machine"],
          (loads[0], loads[-1]))}

{table}

![Spark pipeline rates](img/{PLOT.name})

{how}
{ledger_text(data)}
"""


# -- main ----------------------------------------------------------------------------------------


@click.command()
@click.option("--database-url", default=DEFAULT_ADMIN_URL, show_default=True,
              help="Admin connection; the bench creates and drops its own database.")
@click.option("--rows", type=click.IntRange(1), help="Rows scheduled [1,000,000; quick 100,000].")
@click.option("--stream-rows", type=click.IntRange(1), help="[200,000; quick 20,000]")
@click.option("--read-rows", type=click.IntRange(1), help="[10,000,000; quick 200,000]")
@click.option("--sample", type=click.IntRange(1), help="apply_async calls [5,000; quick 1,000]")
@click.option("--partitions", type=click.IntRange(1), default=8, show_default=True)
@click.option("--ledger-rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Pairs of jobs without/with a run id, per size.")
@click.option("--fair-rounds", type=click.IntRange(0), default=3, show_default=True,
              help="Rounds of COPY / schedule_tasks / with run_id, interleaved (0: none).")
@click.option("--only-fair", is_flag=True,
              help="Only the COPY limit, the first run and the interleaved rounds (no ledger "
                   "pairs, stream, read, apply_async); results not written.")
@click.option("--master", default="local[2]", show_default=True)
@click.option("--redis-url", default=REDIS_URL, show_default=True)
@click.option("--quick", is_flag=True, help="Smaller run (spark_quick.json, docs untouched).")
@click.option("--docs/--no-docs", "write_docs", default=None,
              help="Rewrite the docs/benchmarks.md section [default: unless --quick].")
def main(database_url: str, rows: int | None, stream_rows: int | None, read_rows: int | None,
         sample: int | None, partitions: int, ledger_rounds: int, fair_rounds: int,
         only_fair: bool, master: str, redis_url: str, quick: bool,
         write_docs: bool | None) -> None:
    """Spark bulk scheduling, streaming and reading, against the raw COPY limit."""
    from delayq_transport.spark import local_session

    rows = rows or (100_000 if quick else 1_000_000)
    stream_rows = stream_rows or (20_000 if quick else 200_000)
    read_rows = read_rows or (200_000 if quick else 10_000_000)
    sample = sample or (1_000 if quick else 5_000)
    loads = [os.getloadavg()[0]]
    base = etas_base()
    data: dict[str, Any] = {"master": master, "sample": sample}
    with fresh_database(database_url, prefix=f"delayq_bench13_{uuid.uuid4().hex[:4]}") as url:
        data["machine"] = machine_info(url)
        data["copy"] = copy_limit(url, rows, base)
        checkpoint(database_url)
        loads.append(os.getloadavg()[0])
        spark = local_session("delayq-bench-spark", master=master)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            data["schedule"] = schedule_runs(spark, url, rows, partitions, base)
            checkpoint(database_url)
            loads.append(os.getloadavg()[0])
            if fair_rounds:
                data["fair"] = fair_runs(spark, url, database_url, rows, partitions, base,
                                         fair_rounds)
                loads.append(os.getloadavg()[0])
            if only_fair:
                console.print(f"load averages: {loads}")
                return
            data["ledger"] = ledger_runs(
                spark, url, database_url, {"bulk": (rows, partitions),
                                           "micro-batch": (stream_rows // 5, FILES_PER_BATCH)},
                base, ledger_rounds)
            loads.append(os.getloadavg()[0])
            data["stream"] = stream_run(spark, url, stream_rows, 20, base)
            loads.append(os.getloadavg()[0])
            data["read"] = read_runs(spark, url, read_rows, partitions)
        finally:
            spark.stop()
        loads.append(os.getloadavg()[0])
        data["apply_async"] = apply_async_runs(url, redis_url, sample, base)
    loads.append(os.getloadavg()[0])
    data.update(command=command_line(), git_revision=git_revision(), load_average=loads)
    path = write_results("spark_quick" if quick else "spark", data)
    console.print(f"results: {path}")
    console.print(markdown_table(["What", "Rows", "Seconds", "Rows/s", "vs COPY limit"],
                                 result_rows(data), align="lrrrr"))
    if (not quick) if write_docs is None else write_docs:
        plot(data)
        console.print(f"wrote {replace_section('spark', section(load_results('spark')))}")


if __name__ == "__main__":
    main()
