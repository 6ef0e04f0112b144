"""``schedule_tasks``: one Celery task per DataFrame row, written at the speed of COPY.

How a job runs: the driver validates the options, connects and migrates (fail fast), reads
the database clock once and checks that the executors can import delayq and reach the
database (:func:`.session.check_executors`). In one pass over the input, :mod:`.encode`
builds with Spark SQL functions the message and binary COPY tuple of every row it can encode
exactly; the other rows reach the partition's writer as plain values and go through the
Python encoder of :mod:`.rows`, which builds the same bytes or the reason the row is bad (jobs
with argument types the JVM path does not cover use that encoder as a UDF). Every partition
streams its tuples into a TEMP staging table and merges them into the queue
(``core.integrations.BulkWriter``: one ``INSERT ... ON CONFLICT`` per
``chunk_size`` rows; :mod:`.partition`), and returns its counts, which the driver adds up:
only a successful task attempt's output is collected, so a retried partition is counted once.

Guarantees:

* **Idempotent while rows wait.** A row's key (= its Celery task id) is the ``key`` column, or
  a uuid5 of (task, args, kwargs, eta). Re-running the job, or Spark re-running a failed task,
  finds the keys still stored and creates no duplicate (``ignored``), or replaces them in place
  (``on_conflict="update"``, ``updated``); identical rows are ``ignored`` either way. A task
  that ran has no row left: without a run id, a re-run schedules it again.
* **Applied once per run id.** With ``run_id``, each partition is applied and recorded in the
  run ledger in one transaction (:mod:`.partition`, :mod:`.runs`), so a retried task or a
  re-run of the same run adds nothing (``skipped``) even after the tasks ran.
* **No silent drops.** Rows that cannot become a message are counted as ``bad`` and sampled
  with their reason; ``past_eta="error"`` refuses the whole job first.
* **Loud about unstable keys.** An ETA computed from the clock or randomness
  (``current_timestamp()``, ``rand()``...) without a ``key`` would derive new keys on every
  run, so such a job is refused (:class:`UnstableEta`) before anything is written.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any, cast

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .. import core
from ..core import DelayqError, InvalidInput, validate_table_name
from ..core.ledgers import RunState, record_run
from ..core.queue import duration_ms, to_ms, validate_kind
from ..formats import celery as message
from .encode import jvm_capable, jvm_records
from .partition import COUNTS, write_partition
from .rows import BadRow, Plan, describe, eta_ms, past_reason, slow_record
from .runs import (
    RUN_RETENTION,
    check_run_options,
    driver_queue,
    key_hashes,
    open_run,
    verify_parts,
)
from .session import check_executors

BAD_SAMPLE_SIZE = 20
#: Rows staged per merge statement (``chunk_size``) by default, and the largest allowed.
MERGE_ROWS = 50_000
MAX_CHUNK_ROWS = 1_000_000
ON_CONFLICT = ("ignore", "update")
PAST_ETA_POLICIES = ("run", "skip", "error")
_MS_PER_DAY = 86_400_000
_RECORDS = T.StructType([T.StructField("record", T.BinaryType()),
                         T.StructField("reason", T.StringType()),
                         T.StructField("shown", T.StringType())])
#: Functions whose value changes between runs: an ETA built from them, hashed into the
#: default key, gives every run new keys (issue 13: 2,000,000 rows after two runs of 1M).
_UNSTABLE_RE = re.compile(
    r"\b(current_timestamp|current_date|current_time|localtimestamp|now|rand|randn|uuid|"
    r"shuffle|monotonically_increasing_id|spark_partition_id|input_file_name)\(", re.I)


class PastEta(InvalidInput):
    """``past_eta="error"``: some ETAs are in the past, so nothing was written."""

    def __init__(self, count: int, sample: list[BadRow]) -> None:
        shown = "; ".join(f"{b.row} ({b.reason})" for b in sample[:3])
        super().__init__(f"{count} rows have an ETA in the past (past_eta='error'), nothing "
                         f"was scheduled; e.g. {shown}")
        self.count = count
        self.sample = sample


class UnstableEta(InvalidInput):
    """The ETA depends on the clock or randomness and no ``key`` was given."""


@dataclass(frozen=True)
class ScheduleResult:
    """Counts of one ``schedule_tasks`` run; every input row is in exactly one of them.

    ``skipped``: rows of partitions a run id had applied before (nothing written for them). A
    run recorded whole returns at once: ``skipped`` is then what it applied, ``bad`` is 0.
    """

    created: int
    updated: int
    ignored: int
    bad: int
    bad_sample: list[BadRow] = field(default_factory=list)
    elapsed_s: float = 0.0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.created + self.updated + self.ignored + self.skipped + self.bad

    @property
    def rows_per_s(self) -> float:
        return self.total / self.elapsed_s if self.elapsed_s > 0 else 0.0


def schedule_tasks(
    df: DataFrame,
    task: str,
    eta: str | Column | timedelta | float,
    *,
    database_url: str,
    args: Sequence[str | Column] = (),
    kwargs: Mapping[str, str | Column] | None = None,
    queue: str = message.DEFAULT_QUEUE,
    key: str | Column | None = None,
    on_conflict: str = "ignore",
    priority: int | None = None,
    table: str = "delayed_queue",
    chunk_size: int = MERGE_ROWS,
    past_eta: str = "run",
    spark: SparkSession | None = None,
    sample_size: int = BAD_SAMPLE_SIZE,
    check_workers: bool = True,
    run_id: str | None = None,
    run_retention: timedelta | float = RUN_RETENTION,
) -> ScheduleResult:
    """Schedule one Celery task per row of ``df``, written from every partition in parallel.

    Parameters:
      df: any DataFrame; each row becomes one task.
      task: the registered Celery task name the worker runs.
      eta: a column (name or ``Column``) of type timestamp, timestamp_ntz or date (read as
        UTC), or of ISO-8601 strings (no offset means UTC, as in Celery); or a countdown
        (``timedelta`` or seconds) from the database's clock at job start. Epoch numbers are
        refused: convert them with ``F.timestamp_seconds``.
      database_url: the database, reached from the driver and from every executor.
      args: columns that become the task's positional arguments.
      kwargs: keyword name -> column, the task's keyword arguments.
      queue: the Celery queue.
      key: a column holding each row's key (= its Celery task id, at most 200 characters).
        Without it the key is a uuid5 of (task, args, kwargs, eta), so re-runs find the same
        rows; an ETA computed from the clock or randomness then is refused
        (``delayq_transport.spark.UnstableEta``).
      on_conflict: ``ignore``: a key already waiting is left as it is; ``update``: it is
        replaced in place (new payload and ETA) unless identical (needs ``UPDATE``).
      priority: 0-9, mapped to the transport's priority bucket.
      table: the queue table.
      chunk_size: rows staged per merge statement in each partition (1-1,000,000).
      past_eta: rows whose ETA is before the database's now at job start: ``run`` stores them
        (due at once, as Celery would), ``skip`` counts them as bad rows, ``error`` refuses
        the whole job before writing anything (``delayq_transport.spark.PastEta``).
      spark: the session for the executor check (default: the DataFrame's).
      sample_size: bad rows returned with their reason in ``bad_sample``.
      check_workers: first run one small Spark job that checks the executors can import
        delayq and reach the database (``delayq_transport.spark.ExecutorEnvironmentError``,
        ``DatabaseUnavailable``).
      run_id: a name for this input (1-200 characters): the run is applied once, so a Spark
        task retry or a re-run with the same id adds nothing, even after the tasks ran. None:
        only the keys protect re-runs, while the rows still wait.
      run_retention: how long the run ledger keeps a run's entries (``timedelta`` or
        seconds); every run with a ``run_id`` deletes older entries first.
    """
    started = time.monotonic()
    kwargs = dict(kwargs or {})
    _check_options(task, queue, priority, on_conflict, past_eta, chunk_size, table, kwargs)
    retention_ms = check_run_options(run_id, run_retention)
    countdown_ms = _countdown_ms(eta)
    eta_column = None if countdown_ms is not None else cast("str | Column", eta)
    projected = _project(df, eta_column, key, args, kwargs)
    if eta_column is not None and key is None:
        _refuse_unstable_eta(projected)
    kind = message.kind_for(queue, priority)
    with driver_queue(database_url, table, kind) as driver:
        state = open_run(driver, run_id, retention_ms)
        if state is not None and state.complete is not None:
            return ScheduleResult(0, 0, 0, 0, elapsed_s=time.monotonic() - started,
                                  skipped=state.complete.rows)
        plan = Plan(
            database_url=database_url, table=table, task=task, queue=queue, priority=priority,
            kind=kind, now_ms=to_ms(driver.now(), what="database now"),
            countdown_ms=countdown_ms, has_key=key is not None, arg_count=len(args),
            kwarg_names=tuple(kwargs), ntz_fields=_ntz_fields(projected), past_eta=past_eta,
            can_update=on_conflict == "update", chunk_size=chunk_size,
            origin=f"delayq-spark@{socket.gethostname()}", sample_size=sample_size,
            run_id=run_id,
        )
        if check_workers:
            check_executors(spark or df.sparkSession, database_url)
        result = _write(projected, plan, state, started)
        if run_id is not None:
            record_run(driver, run_id, result.total - result.bad)
        return result


def _write(projected: DataFrame, plan: Plan, state: RunState | None,
           started: float) -> ScheduleResult:
    """The Spark job: every partition writes (or, for a run, skips) its rows."""
    if plan.past_eta == "error" and plan.countdown_ms is None:
        _refuse_past_etas(projected, plan)
    records = _records(projected, plan)
    if state is not None and state.parts:
        verify_parts(records, plan, state)
    try:
        parts = records.mapInArrow(partial(write_partition, plan), COUNTS).collect()
    except Exception as exc:
        raise _partition_failure(exc, plan.run_id) from exc
    return _result(parts, plan.sample_size, time.monotonic() - started)


def _check_options(
    task: str, queue: str, priority: int | None, on_conflict: str, past_eta: str,
    chunk_size: int, table: str, kwargs: Mapping[str, Any],
) -> None:
    """Reject bad arguments on the driver, before Spark does any work."""
    if not isinstance(task, str) or not task:
        raise InvalidInput(f"task must be a non-empty task name, got {task!r}")
    if not isinstance(queue, str) or not queue:
        raise InvalidInput(f"queue must be a non-empty str, got {queue!r}")
    if priority is not None and (not isinstance(priority, int) or not 0 <= priority <= 9):
        raise InvalidInput(f"priority must be None or an int 0-9, got {priority!r}")
    validate_kind(message.kind_for(queue, priority))
    if on_conflict not in ON_CONFLICT:
        raise InvalidInput(f"on_conflict must be one of {ON_CONFLICT}, got {on_conflict!r}")
    if past_eta not in PAST_ETA_POLICIES:
        raise InvalidInput(f"past_eta must be one of {PAST_ETA_POLICIES}, got {past_eta!r}")
    if not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_CHUNK_ROWS:
        raise InvalidInput(f"chunk_size must be an int 1-{MAX_CHUNK_ROWS}, got {chunk_size!r}")
    validate_table_name(table)
    bad_names = [n for n in kwargs if not isinstance(n, str) or not n]
    if bad_names:
        raise InvalidInput(f"kwargs names must be non-empty str, got {bad_names!r}")


def _countdown_ms(eta: object) -> int | None:
    """A countdown in ms, or None when ``eta`` names a column."""
    if isinstance(eta, str | Column):
        return None
    if isinstance(eta, timedelta) or (isinstance(eta, int | float) and not isinstance(eta, bool)):
        return duration_ms(eta, what="eta countdown")
    raise InvalidInput(
        f"eta must be a column name, a Column, or a countdown (timedelta or seconds), got {eta!r}"
    )


def _column(spec: str | Column, what: str) -> Column:
    if isinstance(spec, Column):
        return spec
    if isinstance(spec, str) and spec:
        return F.col(spec)
    raise InvalidInput(f"{what} must be a column name or a Column, got {spec!r}")


def _project(
    df: DataFrame, eta: str | Column | None, key: str | Column | None,
    args: Sequence[str | Column], kwargs: Mapping[str, str | Column],
) -> DataFrame:
    """Select only what the messages need, in the layout ``Plan`` describes."""
    cols: list[Column] = []
    try:
        if eta is not None:
            cols.append(_eta_column(df, _column(eta, "eta")))
        if key is not None:
            cols.append(_column(key, "key").alias("_key"))
        cols += [_column(a, "args item").alias(f"_a{i}") for i, a in enumerate(args)]
        cols += [_column(c, f"kwargs[{n!r}]").alias(f"_k{i}")
                 for i, (n, c) in enumerate(kwargs.items())]
        return df.select(*cols)
    except AnalysisException as exc:
        raise InvalidInput(f"schedule_tasks: {str(exc).splitlines()[0]}") from exc


def _eta_column(df: DataFrame, col: Column) -> Column:
    """Timestamps and dates become epoch ms in Spark (PySpark would hand Python naive local
    datetimes, and the JVM encoder works on ms)."""
    dtype = df.select(col).schema.fields[0].dataType
    if isinstance(dtype, T.TimestampType):
        return F.unix_millis(col).alias("_eta")
    if isinstance(dtype, T.DateType):
        return (F.unix_date(col).cast("long") * _MS_PER_DAY).alias("_eta")
    if isinstance(dtype, T.TimestampNTZType | T.StringType):
        return col.alias("_eta")
    raise InvalidInput(
        f"eta column has type {dtype.simpleString()}: use a timestamp, timestamp_ntz, date or "
        "ISO-8601 string column (epoch seconds: F.timestamp_seconds(col))"
    )


def _refuse_unstable_eta(projected: DataFrame) -> None:
    """The ETA's lineage (the analyzed plan) must not call the clock or a random source."""
    try:
        lineage = projected.select("_eta")._jdf.queryExecution().analyzed().toString()
    except AttributeError:  # Spark Connect: no JVM plan to inspect, nothing to check
        return
    found = _UNSTABLE_RE.search(lineage)
    if found:
        raise UnstableEta(
            f"the eta column depends on {found.group(1)}(), which changes on every run; the "
            "default key hashes the ETA, so each run would schedule every row again. Pass "
            "key= (a column identifying the row, e.g. the user id) or a countdown "
            "(eta=timedelta(hours=1): keyed as such, stable across runs).")


def _ntz_fields(projected: DataFrame) -> frozenset[int]:
    """Positions of timestamp_ntz argument columns, whose naive values are wall-clock times."""
    return frozenset(i for i, f in enumerate(projected.schema.fields)
                     if f.name != "_eta" and isinstance(f.dataType, T.TimestampNTZType))


def _refuse_past_etas(projected: DataFrame, plan: Plan) -> None:
    """Count past ETAs (in Spark for epoch-ms ETAs, in Python for strings and
    timestamp_ntz, read as the rows would be); sample a few as the Python path shows rows."""
    if isinstance(projected.schema.fields[0].dataType, T.LongType):
        past = projected.where(F.col("_eta") < F.lit(plan.now_ms))
        count = past.count()
        rows = past.limit(plan.sample_size).collect() if count else []
    else:
        found = projected.rdd.mapPartitions(partial(_past_etas, plan)).collect()
        count = sum(n for n, _ in found)
        rows = [row for _, sample in found for row in sample][: plan.sample_size]
    if count:
        raise PastEta(count, [BadRow(past_reason(eta_ms(r[0])), describe(plan, r)) for r in rows])


def _past_etas(plan: Plan, rows: Iterable[Any]) -> Iterator[tuple[int, list[Any]]]:
    count, sample = 0, list[Any]()
    for row in rows:
        try:
            ms = eta_ms(row[0])
        except InvalidInput:
            continue  # not a past ETA: counted as bad by the write pass
        if ms < plan.now_ms:
            count += 1
            if len(sample) < plan.sample_size:
                sample.append(row)
    yield count, sample


def _records(projected: DataFrame, plan: Plan) -> DataFrame:
    """(binary COPY tuple, reason it is bad, the bad row shown, the row for Python) per row,
    and with a run id the hash of each tuple's key (``fp``, for its part's fingerprint).

    JVM-capable jobs (see :mod:`.encode`) make one pass: rows the JVM cannot encode arrive at
    the writer as plain values (strings, integers, booleans: the same in Arrow as in a Row)
    for the Python encoder. Other jobs go through the Python encoder as a UDF.
    """
    if jvm_capable(projected, plan):
        fingerprint = [F.col("_dq_fp").alias("fp")] if plan.run_id is not None else []
        return jvm_records(projected, plan).select(
            F.col("_dq_record").alias("record"), F.lit(None).cast("string").alias("reason"),
            F.lit(None).cast("string").alias("shown"), F.col("_dq_row").alias("row"),
            *fingerprint)
    encode = F.udf(lambda row: slow_record(plan, row), _RECORDS)
    every = F.struct(*[F.col(c) for c in projected.columns])
    records = projected.select(encode(every).alias("r")).select(
        "r.*", F.lit(None).cast("string").alias("row"))
    if plan.run_id is None:
        return records
    return records.withColumn("fp", key_hashes(F.col("record")))


def _result(parts: list[Any], sample_size: int, elapsed_s: float) -> ScheduleResult:
    sample = [BadRow(reason, json.loads(shown)) for p in parts
              for reason, shown in json.loads(p.sample)][:sample_size]
    return ScheduleResult(sum(p.created for p in parts), sum(p.updated for p in parts),
                          sum(p.ignored for p in parts), sum(p.bad for p in parts), sample,
                          elapsed_s, sum(p.skipped for p in parts))


#: How a partition's traceback ends with one of delayq's errors: ``<module>.<Name>: text``.
_ERROR_LINE_RE = re.compile(re.escape(DelayqError.__module__) + r"\.(\w+): (.+)")


def _partition_failure(exc: Exception, run_id: str | None = None) -> DelayqError:
    """Surface the delayq error a partition raised (e.g. DatabaseUnavailable) on the driver."""
    found = _ERROR_LINE_RE.findall(str(exc))
    name, text = found[-1] if found else ("DatabaseError", str(exc).strip().splitlines()[-1])
    cls = getattr(core, name, None) if name in core.__all__ else None
    if not (isinstance(cls, type) and issubclass(cls, DelayqError)):
        cls = core.DatabaseError
    after = ("partitions already applied stay applied and recorded; re-running with the same "
             f"run_id {run_id!r} applies only the others" if run_id is not None else
             "rows already written stay; re-running the job adds none of those still waiting, "
             "keys are idempotent")
    return cls(f"schedule_tasks: a partition failed: {text} ({after})")


__all__ = ["PastEta", "ScheduleResult", "UnstableEta", "schedule_tasks"]
