"""Spark: schedule Celery tasks from a DataFrame, and read the queue back as one.

The implementation lives in :mod:`.pipeline`; ``delayq spark-report`` in :mod:`.cli`. Names are
resolved lazily so that ``delayq`` (which imports :mod:`.cli` on every start) never imports
pyspark unless a Spark command runs.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "BadRow",
    "PastEta",
    "QueueReport",
    "ScheduleResult",
    "backlog_by_hour",
    "default_key",
    "eta_ms",
    "id_ranges",
    "local_session",
    "overdue",
    "queue_dataframe",
    "queue_report",
    "redeliveries",
    "schedule_tasks",
    "uuid5",
]


def __getattr__(name: str) -> Any:
    """PEP 562: ``from delayq_transport.spark import schedule_tasks`` imports pyspark here."""
    pipeline = import_module(".pipeline", __name__)
    try:
        return getattr(pipeline, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
