"""Read the queue table back as a DataFrame, and the reports ``delayq spark-report`` prints.

:func:`queue_dataframe` splits the table's id range into one range per partition; each
partition reads its range with keyset-paged queries (no JDBC jar needed, no unbounded result).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial

import pyarrow as pa
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core import InvalidInput, validate_table_name
from ..core.inspect import SCAN_PAGE_ROWS, ScannedRow, id_bounds, scan_range
from ..core.queue import DelayedQueue
from ..formats import celery as message

#: Rows per keyset page when a partition reads its id range back.
READ_PAGE_ROWS = SCAN_PAGE_ROWS

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

    Each partition pages through its range (``core.inspect.scan_range``) and hands Spark Arrow
    batches, column by column. Lazy like any DataFrame: every action reads the table again;
    ``cache()`` it for a consistent snapshot across several reports.

    Parameters:
      spark: the session.
      database_url: the database, reached from the driver and from every executor.
      table: the queue table.
      num_partitions: id ranges read in parallel, one connection each.
      page_rows: rows per statement of each range's keyset-paged read.
    """
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise InvalidInput(f"num_partitions must be a positive int, got {num_partitions!r}")
    if not isinstance(page_rows, int) or page_rows < 1:
        raise InvalidInput(f"page_rows must be a positive int, got {page_rows!r}")
    validate_table_name(table)
    with DelayedQueue(database_url, table=table, ensure_schema=False, pool_max_size=1) as queue:
        bounds = id_bounds(queue)
    if bounds is None:
        return spark.createDataFrame([], QUEUE_SCHEMA)
    ranges = id_ranges(bounds.lo, bounds.hi + 1, num_partitions)
    rdd = spark.sparkContext.parallelize(ranges, len(ranges))
    return spark.createDataFrame(rdd, "lo long, hi long").mapInArrow(
        partial(_read_ranges, database_url, table, page_rows), QUEUE_SCHEMA)


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
    database_url: str, table: str, page_rows: int, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    with DelayedQueue(database_url, table=table, ensure_schema=False, pool_max_size=1) as queue:
        for batch in batches:
            for lo, hi in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                              strict=True):
                for rows in scan_range(queue, lo, hi, page_rows):
                    yield _arrow_page(rows)


_TS = pa.timestamp("us", tz="UTC")


def _timestamps(ms: list[int]) -> pa.Array:
    return pa.array(ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(_TS)


def _arrow_page(rows: list[ScannedRow]) -> pa.RecordBatch:
    """One page as columns: Arrow conversions are vectorised, only the kind split is per row
    (through a cache: a table has few kinds)."""
    ids, keys, kinds, tasks, at, initially, created, in_flight, again = zip(*rows, strict=True)
    split = {kind: message.queue_of_kind(kind) for kind in set(kinds)}
    return pa.RecordBatch.from_arrays([
        pa.array(ids, pa.int64()), pa.array(keys, pa.string()), pa.array(kinds, pa.string()),
        pa.array([split[k][0] for k in kinds], pa.string()),
        pa.array([split[k][1] for k in kinds], pa.int32()), pa.array(tasks, pa.string()),
        _timestamps(list(at)), _timestamps(list(initially)), pa.array(in_flight, pa.bool_()),
        pa.array(again, pa.bool_()), _timestamps(list(created)),
    ], names=QUEUE_SCHEMA.fieldNames())


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


