"""Read the queue table back as a DataFrame, and the reports ``delayq spark-report`` prints.

:func:`queue_dataframe` splits the table's id range into one range per partition; each
partition reads its range with keyset-paged queries (no JDBC jar needed, no unbounded result).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core.errors import InvalidInput
from ..core.queries import validate_table_name
from ..core.queue import DelayedQueue
from ..transport import message
from .rows import at_of as _at

#: Rows per keyset page when a partition reads its id range back.
READ_PAGE_ROWS = 5000

QUEUE_SCHEMA = T.StructType([
    T.StructField("id", T.LongType(), False),
    T.StructField("key", T.StringType(), False),
    T.StructField("kind", T.StringType(), False),
    T.StructField("queue", T.StringType(), False),
    T.StructField("priority", T.IntegerType(), False),
    T.StructField("task", T.StringType(), True),
    T.StructField("scheduled_at", T.TimestampType(), False),
    T.StructField("scheduled_at_initially", T.TimestampType(), False),
    T.StructField("in_flight", T.BooleanType(), False),
    T.StructField("redelivered", T.BooleanType(), False),
    T.StructField("created_at", T.TimestampType(), False),
])


def queue_dataframe(
    spark: SparkSession,
    database_url: str,
    table: str = "delayed_queue",
    num_partitions: int = 4,
    *,
    page_rows: int = READ_PAGE_ROWS,
) -> DataFrame:
    """The queue table as a DataFrame (``QUEUE_SCHEMA``), read by id range in parallel.

    Lazy like any DataFrame: every action reads the table again; ``cache()`` it for a
    consistent snapshot across several reports.
    """
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise InvalidInput(f"num_partitions must be a positive int, got {num_partitions!r}")
    if not isinstance(page_rows, int) or page_rows < 1:
        raise InvalidInput(f"page_rows must be a positive int, got {page_rows!r}")
    validate_table_name(table)
    with DelayedQueue(database_url, table=table, ensure_schema=False, pool_max_size=1) as queue:
        bounds = queue.db.fetchone(queue.queries["scan_bounds"], {"now": None})
    if bounds is None or bounds[0] is None:
        return spark.createDataFrame([], QUEUE_SCHEMA)
    ranges = id_ranges(bounds[0], bounds[1] + 1, num_partitions)
    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).mapPartitions(
        partial(_read_ranges, database_url, table, page_rows)
    )
    return spark.createDataFrame(rdd, QUEUE_SCHEMA, verifySchema=False)


def id_ranges(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """Split [lo, hi) into at most ``parts`` contiguous, non-empty, half-open ranges."""
    parts = max(1, min(parts, hi - lo))
    step, extra = divmod(hi - lo, parts)
    ranges, start = [], lo
    for i in range(parts):
        end = start + step + (1 if i < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def _read_ranges(
    database_url: str, table: str, page_rows: int, ranges: Iterable[tuple[int, int]]
) -> Iterator[tuple[Any, ...]]:
    with DelayedQueue(database_url, table=table, ensure_schema=False, pool_max_size=1) as queue:
        for lo, hi in ranges:
            yield from _read_range(queue, lo, hi, page_rows)


def _read_range(queue: DelayedQueue, lo: int, hi: int, page_rows: int) -> Iterator[tuple[Any, ...]]:
    """Keyset pages of one id range, so no statement returns an unbounded result."""
    while lo < hi:
        params = {"lo": lo, "hi": hi, "limit": page_rows, "now": None}
        rows = queue.db.fetchall(queue.queries["scan_page"], params)
        yield from map(_queue_row, rows)
        if len(rows) < page_rows:
            return
        lo = rows[-1][0] + 1


def _queue_row(r: tuple[Any, ...]) -> tuple[Any, ...]:
    queue_name, bucket = message.queue_of_kind(r[2])
    return (r[0], r[1], r[2], queue_name, bucket, _task_of(r[3]), _at(r[4]), _at(r[5]),
            r[7], r[8], _at(r[6]))


def _task_of(payload: bytes) -> str | None:
    """The Celery task name in the stored message's headers; None for non-Celery rows."""
    try:
        headers = json.loads(bytes(payload)).get("headers") or {}
        task = headers.get("task")
    except (ValueError, AttributeError):
        return None
    return task if isinstance(task, str) else None


# -- reports -------------------------------------------------------------------------------


def backlog_by_hour(df: DataFrame) -> DataFrame:
    """Waiting rows (not in flight) per queue and hour they are due (session time zone)."""
    return (df.where(~F.col("in_flight"))
            .groupBy("queue", F.date_trunc("hour", "scheduled_at").alias("due_hour"))
            .agg(F.count(F.lit(1)).alias("rows"))
            .orderBy("queue", "due_hour"))


def overdue(df: DataFrame, now: datetime | None = None) -> DataFrame:
    """Rows due but not picked up, per queue, with the oldest one's lag in seconds."""
    now_col = F.current_timestamp() if now is None else F.lit(now).cast("timestamp")
    due = df.where(~F.col("in_flight") & (F.col("scheduled_at") <= now_col))
    return (due.groupBy("queue")
            .agg(F.count(F.lit(1)).alias("rows"), F.min("scheduled_at").alias("oldest"))
            .withColumn("max_lag_s",
                        (F.unix_micros(now_col) - F.unix_micros(F.col("oldest"))) / 1e6)
            .orderBy("queue"))


def redeliveries(df: DataFrame) -> DataFrame:
    """Rows delivered before and due again (released or lease lapsed), per queue and task."""
    return (df.where(F.col("redelivered"))
            .groupBy("queue", "task")
            .agg(F.count(F.lit(1)).alias("rows"),
                 F.min("scheduled_at_initially").alias("first_due"))
            .orderBy("queue", "task"))


@dataclass(frozen=True)
class QueueReport:
    """The three reports, collected on the driver from one cached read of the table."""

    rows: int
    backlog: list[Row]
    overdue: list[Row]
    redeliveries: list[Row]


def queue_report(df: DataFrame, now: datetime | None = None) -> QueueReport:
    """Cache while reporting so the three reports agree; a caller's own cache is left alone."""
    owned = not df.is_cached
    if owned:
        df = df.cache()
    try:
        return QueueReport(df.count(), backlog_by_hour(df).collect(), overdue(df, now).collect(),
                           redeliveries(df).collect())
    finally:
        if owned:
            df.unpersist()


