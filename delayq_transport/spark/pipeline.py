"""Schedule Celery tasks from a Spark DataFrame, and read the queue back as one.

Bulk scheduling ("remind 20M subscribers 3 days before renewal") is a Python loop over
``apply_async`` today. :func:`schedule_tasks` instead turns every row into the same protocol-2
message ``apply_async`` would publish and writes it straight into ``delayed_queue`` from every
partition in parallel (``DelayedQueue.offer_batch``, multi-row inserts in bounded chunks). A
normal ``celery worker`` on the ``delayq+postgresql://`` broker runs each row at its ETA.

Guarantees:

* **Idempotent.** A row's key (= its Celery task id) is the ``key`` column, or a uuid5 of
  (task, args, kwargs, eta). Re-running the job, or Spark re-running a failed task, finds the
  keys already stored and creates no duplicate (``ignored``), or replaces them in place
  (``on_conflict="update"``, ``updated``); identical rows are ``ignored`` either way.
* **No silent drops.** Rows that cannot become a message (null ETA, arguments JSON cannot
  carry, a key over 200 characters, an ETA in the past under ``past_eta="skip"``) are counted
  as ``bad`` and sampled with their reason; ``past_eta="error"`` refuses the whole job first.
* **Fail fast.** The driver connects (and migrates) before any partition starts, so an
  unreachable database is one :class:`~delayq_transport.core.errors.DatabaseUnavailable`.

:func:`queue_dataframe` reads the table back with one range query per partition (no JDBC jar
needed) for the reporting helpers :func:`backlog_by_hour`, :func:`overdue` and
:func:`redeliveries` that ``delayq spark-report`` prints.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from decimal import Decimal
from functools import cache, partial
from itertools import islice
from typing import Any, NamedTuple, cast

from pyspark import Accumulator, AccumulatorParam, SparkContext
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core import errors, scan, validate_table_name
from ..core.db import normalize_url
from ..core.errors import DelayqError, InvalidInput
from ..core.queue import OFFER_BATCH_CHUNK, DelayedQueue, validate_key, validate_kind
from ..core.timeutil import duration_ms, to_ms
from ..core.types import Offer
from ..transport import message

#: Namespace of the uuid5 keys and delivery tags derived from row content (never change it:
#: re-runs must derive the same keys).
KEY_NAMESPACE = uuid.UUID("6f1d3c2e-5b7a-4e8f-9a0b-d1e2f3a4b5c6")
_NAMESPACE_BYTES = KEY_NAMESPACE.bytes
BAD_SAMPLE_SIZE = 20
#: Rows per keyset page when a partition reads its id range back.
READ_PAGE_ROWS = 5000
#: Largest chunk handed to one ``offer_batch`` call; bounds the memory of one partition.
MAX_CHUNK_ROWS = 10_000
ON_CONFLICT = ("ignore", "update")
PAST_ETA_POLICIES = ("run", "skip", "error")
_REPR_CHARS = 200
_PLAIN = (str, int, float, bool, type(None))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Local-mode defaults for CLI, tests, examples and benches: no UI, few shuffle partitions,
#: UTC so hour buckets read the same on every machine.
LOCAL_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
}


class PastEta(InvalidInput):
    """``past_eta="error"``: some ETAs are in the past, so nothing was written."""

    def __init__(self, count: int, sample: list[BadRow]) -> None:
        shown = "; ".join(f"{b.row} ({b.reason})" for b in sample[:3])
        super().__init__(f"{count} rows have an ETA in the past (past_eta='error'), nothing "
                         f"was scheduled; e.g. {shown}")
        self.count = count
        self.sample = sample


@dataclass(frozen=True)
class BadRow:
    """A row that could not become a message, and why (values shown as truncated reprs)."""

    reason: str
    row: dict[str, str]


@dataclass(frozen=True)
class ScheduleResult:
    """Counts of one ``schedule_tasks`` run; every input row is in exactly one of them."""

    created: int
    updated: int
    ignored: int
    bad: int
    bad_sample: list[BadRow] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def total(self) -> int:
        return self.created + self.updated + self.ignored + self.bad

    @property
    def rows_per_s(self) -> float:
        return self.total / self.elapsed_s if self.elapsed_s > 0 else 0.0


# -- the plan every partition receives ---------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """Everything a partition needs, picklable; row layout: [eta] [key] args... kwargs..."""

    database_url: str
    table: str
    task: str
    queue: str
    priority: int | None
    kind: str
    now_ms: int
    countdown_ms: int | None
    has_key: bool
    arg_count: int
    kwarg_names: tuple[str, ...]
    ntz_fields: frozenset[int]
    past_eta: str
    can_update: bool
    chunk_size: int
    origin: str
    sample_size: int
    key_at: int = field(init=False)
    args_at: int = field(init=False)
    kwargs_at: int = field(init=False)

    def __post_init__(self) -> None:
        # Offsets are read for every row: computed once, not per access.
        key_at = 0 if self.countdown_ms is not None else 1
        object.__setattr__(self, "key_at", key_at)
        object.__setattr__(self, "args_at", key_at + int(self.has_key))
        object.__setattr__(self, "kwargs_at", key_at + int(self.has_key) + self.arg_count)


class _SampleParam(AccumulatorParam):
    """A list accumulator capped at ``cap`` items, for the bad-row sample."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def zero(self, value: list[BadRow]) -> list[BadRow]:
        return []

    def addInPlace(self, a: list[BadRow], b: list[BadRow]) -> list[BadRow]:  # noqa: N802
        a.extend(b[: max(self.cap - len(a), 0)])
        return a


class _Accumulators(NamedTuple):
    created: Accumulator[int]
    updated: Accumulator[int]
    ignored: Accumulator[int]
    bad: Accumulator[int]
    sample: Accumulator[list[BadRow]]

    @classmethod
    def create(cls, sc: SparkContext, sample_size: int) -> _Accumulators:
        return cls(sc.accumulator(0), sc.accumulator(0), sc.accumulator(0), sc.accumulator(0),
                   sc.accumulator([], _SampleParam(sample_size)))

    def add(self, counts: Counter[str], sample: list[BadRow]) -> None:
        """Once per partition: Spark keeps only a successful task attempt's updates."""
        for name in ("created", "updated", "ignored", "bad"):
            if counts[name]:
                getattr(self, name).add(counts[name])
        if sample:
            self.sample.add(sample)

    def result(self, elapsed_s: float) -> ScheduleResult:
        return ScheduleResult(self.created.value, self.updated.value, self.ignored.value,
                              self.bad.value, list(self.sample.value), elapsed_s)


# -- schedule_tasks: the driver ------------------------------------------------------------


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
    chunk_size: int = OFFER_BATCH_CHUNK,
    past_eta: str = "run",
    spark: SparkSession | None = None,
    sample_size: int = BAD_SAMPLE_SIZE,
) -> ScheduleResult:
    """Schedule one Celery task per row of ``df``; see the module docstring for guarantees.

    ``eta`` is a column (timestamp, timestamp_ntz or date read as UTC, or ISO-8601 string) or a
    countdown (timedelta or seconds) from the database's now at job start. ``args``/``kwargs``
    name the columns that become the task's arguments.
    """
    started = time.monotonic()
    kwargs = dict(kwargs or {})
    _check_options(task, queue, priority, on_conflict, past_eta, chunk_size, table, kwargs)
    countdown_ms = _countdown_ms(eta)
    eta_column = None if countdown_ms is not None else cast("str | Column", eta)
    projected = _project(df, eta_column, key, args, kwargs)
    kind = message.kind_for(queue, priority)
    plan = _Plan(
        database_url=database_url, table=table, task=task, queue=queue, priority=priority,
        kind=kind, now_ms=_probe(database_url, table, kind), countdown_ms=countdown_ms,
        has_key=key is not None, arg_count=len(args), kwarg_names=tuple(kwargs),
        ntz_fields=_ntz_fields(projected), past_eta=past_eta,
        can_update=on_conflict == "update", chunk_size=chunk_size,
        origin=f"delayq-spark@{socket.gethostname()}", sample_size=sample_size,
    )
    if past_eta == "error" and countdown_ms is None:
        _refuse_past_etas(projected, plan)
    accs = _Accumulators.create((spark or df.sparkSession).sparkContext, sample_size)
    try:
        projected.rdd.foreachPartition(partial(_write_partition, plan, accs))
    except Exception as exc:
        raise _partition_failure(exc) from exc
    return accs.result(time.monotonic() - started)


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
    """Select only what the messages need, in the layout ``_Plan`` describes."""
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
    """Timestamps become epoch ms in Spark: PySpark would hand Python naive local datetimes."""
    dtype = df.select(col).schema.fields[0].dataType
    if isinstance(dtype, T.TimestampType):
        return F.unix_millis(col).alias("_eta")
    if isinstance(dtype, T.TimestampNTZType | T.DateType | T.StringType):
        return col.alias("_eta")
    raise InvalidInput(
        f"eta column has type {dtype.simpleString()}: use a timestamp, timestamp_ntz, date or "
        "ISO-8601 string column (epoch seconds: F.timestamp_seconds(col))"
    )


def _ntz_fields(projected: DataFrame) -> frozenset[int]:
    """Positions of timestamp_ntz argument columns, whose naive values are wall-clock times."""
    return frozenset(i for i, f in enumerate(projected.schema.fields)
                     if f.name != "_eta" and isinstance(f.dataType, T.TimestampNTZType))


def _probe(database_url: str, table: str, kind: str) -> int:
    """Connect and migrate on the driver (fail fast), and read the one clock of the job."""
    normalize_url(database_url)
    with DelayedQueue(database_url, kind=kind, table=table, pool_max_size=1) as queue:
        return to_ms(queue.now(), what="database now")


def _refuse_past_etas(projected: DataFrame, plan: _Plan) -> None:
    found = projected.rdd.mapPartitions(partial(_past_etas, plan)).collect()
    count = sum(n for n, _ in found)
    if count:
        raise PastEta(count, [b for _, sample in found for b in sample][: plan.sample_size])


def _past_etas(plan: _Plan, rows: Iterable[Row]) -> Iterator[tuple[int, list[BadRow]]]:
    count, sample = 0, list[BadRow]()
    for row in rows:
        try:
            ms = eta_ms(row[0])
        except InvalidInput:
            continue  # not a past ETA: counted as bad by the write pass
        if ms < plan.now_ms:
            count += 1
            if len(sample) < plan.sample_size:
                sample.append(BadRow(_past_reason(ms), _describe(plan, row)))
    yield count, sample


_ERROR_LINE_RE = re.compile(r"delayq_transport\.core\.errors\.(\w+): (.+)")


def _partition_failure(exc: Exception) -> DelayqError:
    """Surface the delayq error a partition raised (e.g. DatabaseUnavailable) on the driver."""
    found = _ERROR_LINE_RE.findall(str(exc))
    name, text = found[-1] if found else ("DatabaseError", str(exc).strip().splitlines()[-1])
    cls = getattr(errors, name, errors.DatabaseError)
    return cls(f"schedule_tasks: a partition failed: {text} (rows already written stay; "
               "re-running the job is safe, keys are idempotent)")


# -- schedule_tasks: one partition ---------------------------------------------------------


def _write_partition(plan: _Plan, accs: _Accumulators, rows: Iterable[Row]) -> None:
    """Turn rows into offers chunk by chunk; one small pool per partition, opened lazily."""
    counts: Counter[str] = Counter()
    sample: list[BadRow] = []
    queue: DelayedQueue | None = None
    try:
        for chunk in _chunks(rows, plan.chunk_size):
            offers = _offers(plan, chunk, counts, sample)
            if offers:
                queue = queue or DelayedQueue(plan.database_url, kind=plan.kind, table=plan.table,
                                              ensure_schema=False, pool_max_size=1)
                counts.update(o.value for o in queue.offer_batch(offers, plan.can_update,
                                                                 chunk_size=plan.chunk_size))
    finally:
        if queue is not None:
            queue.close()
    accs.add(counts, sample)


def _chunks(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def _offers(
    plan: _Plan, chunk: list[Row], counts: Counter[str], sample: list[BadRow]
) -> list[Offer]:
    offers: list[Offer] = []
    for row in chunk:
        prepared = _prepare(plan, row)
        if isinstance(prepared, BadRow):
            counts["bad"] += 1
            if len(sample) < plan.sample_size:
                sample.append(prepared)
        else:
            offers.append(prepared)
    return offers


def _prepare(plan: _Plan, row: Row) -> Offer | BadRow:
    """One row -> the stored message of its Celery task, or the reason it cannot be one."""
    try:
        at_ms, eta_token = _row_eta(plan, row)
        args = [_jsonable(row[i], i in plan.ntz_fields)
                for i in range(plan.args_at, plan.kwargs_at)]
        kwargs = {name: _jsonable(row[plan.kwargs_at + j], plan.kwargs_at + j in plan.ntz_fields)
                  for j, name in enumerate(plan.kwarg_names)}
        key = _row_key(plan, row, args, kwargs, eta_token)
        at = _at(at_ms)
        # The delivery tag is content-derived, so an unchanged row re-offered with
        # on_conflict="update" is IGNORED.
        payload = _encoder(plan.task, plan.queue, plan.priority, plan.origin).encode(
            args, kwargs, task_id=key, eta=at, delivery_tag=uuid5(f"{plan.kind}\x00{key}"))
    except (InvalidInput, TypeError, ValueError, OverflowError) as exc:
        return BadRow(str(exc), _describe(plan, row))
    return Offer(key, payload, at)


@cache
def _encoder(
    task: str, queue: str, priority: int | None, origin: str
) -> message.TaskMessageEncoder:
    """One per task and executor process: the message skeleton is serialised once."""
    return message.TaskMessageEncoder(task, queue=queue, priority=priority, origin=origin)


def _row_eta(plan: _Plan, row: Row) -> tuple[int, int | str]:
    """(ETA in epoch ms, what the default key hashes for it)."""
    if plan.countdown_ms is not None:
        return plan.now_ms + plan.countdown_ms, f"countdown:{plan.countdown_ms}"
    ms = eta_ms(row[0])
    if ms < plan.now_ms and plan.past_eta != "run":
        raise InvalidInput(_past_reason(ms, plan.past_eta))
    return ms, ms


def _past_reason(ms: int, policy: str = "error") -> str:
    return f"eta {_at(ms).isoformat()} is in the past (past_eta={policy!r})"


def eta_ms(value: object) -> int:
    """An ETA cell as epoch ms; naive datetimes and strings without an offset are UTC."""
    if value is None:
        raise InvalidInput("eta is null")
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # already converted by Spark (unix_millis of a timestamp column)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise InvalidInput(f"eta {value!r} is not an ISO-8601 timestamp") from exc
    if isinstance(value, datetime):
        return to_ms(value if value.tzinfo else value.replace(tzinfo=UTC), what="eta")
    if isinstance(value, date):
        return to_ms(datetime.combine(value, dtime(), UTC), what="eta")
    raise InvalidInput(f"eta must be a timestamp, got {type(value).__name__} {value!r}")


def _row_key(
    plan: _Plan, row: Row, args: list[Any], kwargs: dict[str, Any], eta_token: int | str
) -> str:
    if not plan.has_key:
        return default_key(plan.task, args, kwargs, eta_token)
    raw = row[plan.key_at]
    if raw is None:
        raise InvalidInput("key is null")
    return validate_key(raw if isinstance(raw, str) else str(raw))


def default_key(task: str, args: Sequence[Any], kwargs: Mapping[str, Any], eta: int | str) -> str:
    """uuid5 of the canonical JSON of (task, args, kwargs, eta): same row, same task id."""
    try:
        canonical = json.dumps([task, list(args), dict(kwargs), eta], sort_keys=True,
                               separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"task {task} arguments are not JSON-serialisable: {exc}") from exc
    return uuid5(canonical)


def uuid5(name: str) -> str:
    """``str(uuid.uuid5(KEY_NAMESPACE, name))`` without building UUID objects (hot path)."""
    h = hashlib.sha1(_NAMESPACE_BYTES + name.encode()).hexdigest()
    variant = "89ab"[int(h[16], 16) & 0x3]
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{variant}{h[17:20]}-{h[20:32]}"


def _jsonable(value: Any, ntz: bool = False) -> Any:
    """Spark cell -> what Celery's JSON carries; kombu's typed forms keep datetime/Decimal/bytes.

    Naive datetimes of ``timestamp`` columns are local time (PySpark's conversion), those of
    ``timestamp_ntz`` columns (``ntz``) are wall-clock and stay naive.
    """
    if type(value) in _PLAIN:
        return value
    if isinstance(value, Row):
        return {k: _jsonable(v, ntz) for k, v in value.asDict().items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, ntz) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v, ntz) for k, v in value.items()}
    if isinstance(value, datetime):
        aware = value if value.tzinfo or ntz else value.astimezone(UTC)
        return {"__type__": "datetime", "__value__": aware.isoformat()}
    if isinstance(value, date):
        return {"__type__": "date", "__value__": value.isoformat()}
    if isinstance(value, Decimal):
        return {"__type__": "decimal", "__value__": str(value)}
    if isinstance(value, bytes | bytearray):
        return {"__type__": "base64", "__value__": base64.b64encode(value).decode()}
    return value  # anything else: JSON decides, and refuses with a reason


def _describe(plan: _Plan, row: Row) -> dict[str, str]:
    """A bad row for humans: its fields as truncated reprs (the sample must stay small)."""
    shown: dict[str, Any] = {}
    if plan.countdown_ms is None:
        shown["eta"] = row[0]
    if plan.has_key:
        shown["key"] = row[plan.key_at]
    shown["args"] = list(row[plan.args_at : plan.kwargs_at])
    shown["kwargs"] = dict(zip(plan.kwarg_names, row[plan.kwargs_at :], strict=True))
    described = {k: _truncate(repr(v)) for k, v in shown.items()}
    if isinstance(shown.get("eta"), int):  # epoch ms from Spark: show the instant instead
        described["eta"] = _at(shown["eta"]).isoformat()
    return described


def _truncate(text: str) -> str:
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


# -- reading the queue back ----------------------------------------------------------------

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
        bounds = scan.id_bounds(queue)
    if bounds is None:
        return spark.createDataFrame([], QUEUE_SCHEMA)
    ranges = id_ranges(bounds.lo, bounds.hi + 1, num_partitions)
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
        rows = scan.scan_page(queue, lo, hi, page_rows)
        yield from map(_queue_row, rows)
        if len(rows) < page_rows:
            return
        lo = rows[-1].id + 1


def _queue_row(r: tuple[Any, ...]) -> tuple[Any, ...]:
    queue_name, bucket = message.queue_of_kind(r[2])
    return (r[0], r[1], r[2], queue_name, bucket, _task_of(r[3]), _at(r[4]), _at(r[5]),
            r[7], r[8], _at(r[6]))


def _at(ms: int) -> datetime:
    """Exact, unlike ``datetime.fromtimestamp(ms / 1000)`` (float rounding)."""
    return _EPOCH + timedelta(milliseconds=ms)


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


# -- sessions ------------------------------------------------------------------------------


def local_session(
    app_name: str = "delayq", master: str = "local[2]", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A local-mode session with ``LOCAL_CONF``; executors run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for name, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(name, value)
    return builder.getOrCreate()
