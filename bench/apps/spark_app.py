"""The Spark app: ``schedule_tasks`` over generated rows, and the limit it is held to, one
process binary-COPYing the same rows (built beforehand, untimed) into a queue table.

    python spark_app.py schedule URL ROWS   # first run, then the re-run (every row ignored)
    python spark_app.py copy URL ROWS

Prints the figures as JSON. Run by the harness in a process of the revision measured.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

TASK, QUEUE, SPREAD_S, CHUNK, PARTITIONS = "bench.remind", "bench_spark", 86_400, 50_000, 8


def _base() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)


def _users(spark: Any, rows: int, partitions: int, base: datetime) -> Any:
    from pyspark.sql import functions as F

    return spark.range(rows, numPartitions=partitions).select(
        F.col("id").alias("user_id"),
        (F.lit(base) + F.make_interval(secs=F.col("id") % SPREAD_S)).alias("eta"),
        F.concat(F.lit("user"), F.col("id").cast("string"), F.lit("@example.com")).alias("email"))


def schedule(url: str, rows: int) -> dict[str, float]:
    from delayq_transport.spark import local_session, schedule_tasks

    spark = local_session("delayq-bench-spark", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        def run(df: Any, task: str = TASK) -> Any:
            return schedule_tasks(df, task, "eta", args=["user_id"], kwargs={"email": "email"},
                                  queue=QUEUE, database_url=url, run_id=f"bench-{time.time_ns()}")

        run(_users(spark, 20_000, 2, _base()), TASK + ".warmup")  # the JIT, the workers
        df = _users(spark, rows, PARTITIONS, _base())
        first, again = run(df), run(df)
    finally:
        spark.stop()
    assert (first.created, first.ignored, first.bad) == (rows, 0, 0), first
    assert (again.created, again.ignored, again.bad) == (0, rows, 0), again
    return {"rows_per_s": round(first.rows_per_s), "rerun_rows_per_s": round(again.rows_per_s)}


def _chunks(rows: int, now_ms: int) -> Iterator[bytes]:
    from delayq_transport.core.integrations import direct_record
    from delayq_transport.spark.rows import default_key, encoder

    enc, base_ms = encoder(TASK, QUEUE, None, "bench"), int(_base().timestamp() * 1000)
    for start in range(0, rows, CHUNK):
        parts = []
        for i in range(start, min(start + CHUNK, rows)):
            at = base_ms + (i % SPREAD_S) * 1000
            args, kwargs = [i], {"email": f"user{i}@example.com"}
            key = default_key(TASK, args, kwargs, at)
            payload = enc.encode(args, kwargs, task_id=key,
                                 eta=datetime.fromtimestamp(at / 1000, UTC), delivery_tag=key)
            parts.append(direct_record(key, QUEUE, payload, at, now_ms))
        yield b"".join(parts)


def copy(url: str, rows: int) -> dict[str, float]:
    from delayq_transport import DelayedQueue
    from delayq_transport.core.db import Database
    from delayq_transport.core.integrations import copy_direct

    DelayedQueue(url, table="bench_copy", pool_max_size=1).close()
    chunks = list(_chunks(rows, int(time.time() * 1000)))
    with Database(url, max_size=1) as db:
        start = time.perf_counter()
        for chunk in chunks:
            copy_direct(db, "bench_copy", [chunk])
        spent = time.perf_counter() - start
    return {"rows_per_s": round(rows / spent)}


if __name__ == "__main__":
    what, url, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(json.dumps((schedule if what == "schedule" else copy)(url, rows)))
