"""``schedule_stream``: a Structured Streaming sink that schedules one Celery task per row.

Each micro-batch goes through :func:`.write.schedule_tasks` from ``foreachBatch``. Exactly-once
effect across restarts comes from the keys, not from the sink: a micro-batch that was written
but not yet committed to the checkpoint when the query died is replayed after a restart with
the same rows, which derive the same keys (the ``key`` column, or the content hash of task,
args, kwargs and ETA), so the replay adds nothing (``ignored``). Nothing is lost: Spark only
commits a batch to the checkpoint after ``foreachBatch`` returned.

What must hold for that: the rows of a replayed batch are the same (any replayable source:
files, Kafka, rate), and the key does not depend on when the batch ran (an ETA from
``current_timestamp()`` without ``key`` is refused, as in batch jobs; countdowns are keyed as
such and are safe).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql.streaming import StreamingQuery

from ..core.errors import InvalidInput
from ..transport import message
from .session import check_executors
from .write import ScheduleResult, _project, _refuse_unstable_eta, schedule_tasks

BatchCallback = Callable[[int, ScheduleResult], None]


@dataclass
class StreamHandle:
    """The running query and the counts of the micro-batches this process wrote."""

    query: StreamingQuery | None = None
    created: int = 0
    updated: int = 0
    ignored: int = 0
    bad: int = 0
    batches: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, result: ScheduleResult) -> None:
        with self._lock:
            self.created += result.created
            self.updated += result.updated
            self.ignored += result.ignored
            self.bad += result.bad
            self.batches += 1

    @property
    def total(self) -> int:
        return self.created + self.updated + self.ignored + self.bad

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

    ``checkpoint_location`` is required: it is what a restarted query resumes from.
    ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``,
    ``{"processingTime": "10 seconds"}``). ``on_batch(batch_id, result)`` is called after
    each micro-batch is stored; other ``options`` go to :func:`schedule_tasks`
    (``on_conflict``, ``priority``, ``past_eta``, ``table``, ...).
    """
    if not df.isStreaming:
        raise InvalidInput("schedule_stream needs a streaming DataFrame (spark.readStream...); "
                           "use schedule_tasks for a batch DataFrame")
    if not isinstance(checkpoint_location, str) or not checkpoint_location:
        raise InvalidInput("schedule_stream needs a checkpoint_location to resume from")
    if not isinstance(eta, timedelta | int | float) and key is None:
        _refuse_unstable_eta(_project(df, eta, key, args, kwargs or {}))
    check_executors(df.sparkSession, database_url)
    handle = StreamHandle()  # before start(): the first batch may run before start() returns

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        result = schedule_tasks(batch, task, eta, database_url=database_url, args=args,
                                kwargs=kwargs, key=key, queue=queue, check_workers=False,
                                **options)
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
    return handle
