"""Spark: schedule Celery tasks from a DataFrame (batch or streaming), and read the queue back.

Modules: :mod:`.write` (``schedule_tasks``), :mod:`.stream` (``schedule_stream``),
:mod:`.encode` (messages built in the JVM), :mod:`.rows` (the per-row Python encoder),
:mod:`.read` (``queue_dataframe`` and the reports), :mod:`.session` (local sessions, the
executor check); ``delayq spark-report`` in :mod:`.cli`. Names are resolved lazily so that
``delayq`` (which imports :mod:`.cli` on every start) never imports pyspark unless a Spark
command runs.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: Public name -> the module defining it.
_EXPORTS = {
    "BadRow": "rows",
    "KEY_NAMESPACE": "rows",
    "default_key": "rows",
    "eta_ms": "rows",
    "uuid5": "rows",
    "PastEta": "write",
    "ScheduleResult": "write",
    "UnstableEta": "write",
    "schedule_tasks": "write",
    "_partition_failure": "write",
    "StreamHandle": "stream",
    "schedule_stream": "stream",
    "QUEUE_SCHEMA": "read",
    "QueueReport": "read",
    "backlog_by_hour": "read",
    "id_ranges": "read",
    "overdue": "read",
    "queue_dataframe": "read",
    "queue_report": "read",
    "redeliveries": "read",
    "ExecutorEnvironmentError": "session",
    "LOCAL_CONF": "session",
    "check_executors": "session",
    "local_session": "session",
}

__all__ = sorted(n for n in _EXPORTS if not n.startswith("_"))


def __getattr__(name: str) -> Any:
    """PEP 562: ``from delayq_transport.spark import schedule_tasks`` imports pyspark here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
