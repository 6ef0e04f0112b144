"""``schedule_stream``: a Structured Streaming sink that schedules one Celery task per row.

Each micro-batch goes through :func:`.write.schedule_tasks` from ``foreachBatch``, as the run
``stream/<query id>/<batch id>`` of the run ledger (:mod:`.runs`). Spark commits a batch to the
checkpoint only after ``foreachBatch`` returned, so a query that dies in between replays that
batch after a restart, under the same query id (kept in the checkpoint) and batch id: the
replay finds the batch recorded and writes nothing (``skipped``), even if its tasks were due at
once and already ran (their rows acked and gone, so keys alone would not have stopped them:
issue 29). A batch that died half-way is resumed part by part: each partition was applied and
recorded in one transaction, and a recorded partition writes nothing (if it holds the same
records; see :mod:`..core.ledgers`). Nothing is lost: a batch is only committed once stored.

What must hold for that: the source replays a batch with the same rows (files, Kafka, rate),
and a batch that died half-way is split into the same partitions when replayed (the same
files or offsets on the same Spark configuration); a replay split otherwise is refused
(``RunMismatch``) rather than guessed at. Ledger entries are kept ``run_retention`` (7 days by
default): a query restarted later than that replays its last batch protected only by keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql.streaming import StreamingQuery

from ..core import InvalidInput
from ..formats import celery as message
from .session import check_executors
from .write import ScheduleResult, _project, _refuse_unstable_eta, schedule_tasks

BatchCallback = Callable[[int, ScheduleResult], None]
#: Spark's local property naming the streaming query (its id, kept in the checkpoint) on the
#: thread that runs ``foreachBatch``.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: Bound on waiting for ``start()`` to hand over the query when that property is missing.
QUERY_WAIT_S = 60.0


@dataclass
class StreamHandle:
    """The running query and the counts of the micro-batches this process wrote."""

    query: StreamingQuery | None = None
    created: int = 0
    updated: int = 0
    ignored: int = 0
    bad: int = 0
    batches: int = 0
    #: Rows of replayed batches (or their partitions) found applied before: nothing written.
    skipped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _started: threading.Event = field(default_factory=threading.Event, repr=False)

    def add(self, result: ScheduleResult) -> None:
        with self._lock:
            self.created += result.created
            self.updated += result.updated
            self.ignored += result.ignored
            self.skipped += result.skipped
            self.bad += result.bad
            self.batches += 1

    @property
    def total(self) -> int:
        return self.created + self.updated + self.ignored + self.skipped + self.bad

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()


def schedule_stream(
    df: DataFrame,
    task: str,
    eta: str | Column | timedelta | float,
    *,
    database_url: str,
    checkpoint_location: str,
    args: Sequence[str | Column] = (),
    kwargs: Mapping[str, str | Column] | None = None,
    key: str | Column | None = None,
    queue: str = message.DEFAULT_QUEUE,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    on_batch: BatchCallback | None = None,
    **options: Any,
) -> StreamHandle:
    """Start a streaming query that schedules every row of the streaming ``df``.

    Each micro-batch goes through :func:`schedule_tasks` as the run
    ``stream/<query id>/<batch id>``, so a batch replayed after a restart writes nothing.

    Parameters:
      df: a streaming DataFrame (``spark.readStream...``).
      task, eta, database_url, args, kwargs, key, queue: as for ``schedule_tasks``.
      checkpoint_location: required: what a restarted query resumes from.
      trigger: passed to ``DataStreamWriter.trigger`` (``{"availableNow": True}``,
        ``{"processingTime": "30 seconds"}``).
      query_name: the streaming query's name.
      on_batch: ``on_batch(batch_id, result)``, called after each micro-batch is stored.
      options: other ``schedule_tasks`` parameters (``on_conflict``, ``priority``,
        ``past_eta``, ``table``, ``chunk_size``, ``run_retention``...; not ``run_id``).
    """
    if not df.isStreaming:
        raise InvalidInput("schedule_stream needs a streaming DataFrame (spark.readStream...); "
                           "use schedule_tasks for a batch DataFrame")
    if not isinstance(checkpoint_location, str) or not checkpoint_location:
        raise InvalidInput("schedule_stream needs a checkpoint_location to resume from")
    if "run_id" in options:
        raise InvalidInput("schedule_stream names each micro-batch's run itself "
                           "(stream/<query id>/<batch id>): do not pass run_id")
    if not isinstance(eta, timedelta | int | float) and key is None:
        _refuse_unstable_eta(_project(df, eta, key, args, kwargs or {}))
    check_executors(df.sparkSession, database_url)
    handle = StreamHandle()  # before start(): the first batch may run before start() returns

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        run_id = f"stream/{_query_id(batch, handle)}/{batch_id}"
        result = schedule_tasks(batch, task, eta, database_url=database_url, args=args,
                                kwargs=kwargs, key=key, queue=queue, check_workers=False,
                                run_id=run_id, **options)
        handle.add(result)
        if on_batch is not None:
            on_batch(batch_id, result)

    writer = df.writeStream.foreachBatch(write_batch).option(
        "checkpointLocation", checkpoint_location)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    handle.query = writer.start()
    handle._started.set()
    return handle


def _query_id(batch: DataFrame, handle: StreamHandle) -> str:
    """The query's id, which a restart from the same checkpoint keeps (its run id changes)."""
    found = batch.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if found:
        return str(found)
    if not handle._started.wait(QUERY_WAIT_S) or handle.query is None:
        raise RuntimeError(f"schedule_stream: no query id after {QUERY_WAIT_S} s")
    return str(handle.query.id)
