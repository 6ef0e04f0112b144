"""How Django's task framework (``django.tasks``, delayq_transport/django/tasks.py) stores a
task in a ``delayed_queue`` row, for every front end that reads or writes them (the backend and
its worker, the task listings and the web page). No Django import.

* kind ``django:<queue>:<priority>`` (priority -100..100), key: the task's result id;
* payload: JSON ``{"task": module path, "args", "kwargs", "backend": TASKS alias, "queue",
  "priority", "run_after_us": epoch microseconds or null, "enqueued_at": epoch ms}``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

#: Every kind of a django.tasks task starts with it.
KIND_PREFIX = "django:"
#: Django's priority range (``django.tasks.base.TASK_MIN_PRIORITY``/``MAX``).
MIN_PRIORITY, MAX_PRIORITY = -100, 100
#: A kind is at most 100 characters: the queue name's share.
MAX_QUEUE_NAME = 100 - len(KIND_PREFIX) - len(f":{MIN_PRIORITY}")
#: What every task's payload holds.
TASK_FIELDS = frozenset({"task", "args", "kwargs", "backend", "queue", "priority"})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def kind_of(queue_name: str, priority: int) -> str:
    """The row kind of a task of this queue and priority."""
    return f"{KIND_PREFIX}{queue_name}:{int(priority)}"


def kinds_for(queue_names: list[str]) -> list[str]:
    """Every kind of these queues, in the order a worker takes them: highest priority first,
    across the queues (within one priority, in the order given)."""
    return [kind_of(q, p) for p in range(MAX_PRIORITY, MIN_PRIORITY - 1, -1)
            for q in queue_names]


def decode_django_task(payload: bytes) -> dict[str, Any] | None:
    """A row's payload as a django.tasks task, or None if it is not one."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not TASK_FIELDS <= data.keys():
        return None
    return data


def with_run_after(payload: bytes, at: datetime) -> bytes:
    """The payload with ``run_after`` moved to ``at`` (a rescheduled row: the task's result then
    shows the time it runs at)."""
    data = json.loads(payload)
    data["run_after_us"] = (at.astimezone(UTC) - _EPOCH) // timedelta(microseconds=1)
    return json.dumps(data, separators=(",", ":")).encode()


def run_after_iso(data: dict[str, Any]) -> str | None:
    us = data.get("run_after_us")
    return None if us is None else (_EPOCH + timedelta(microseconds=int(us))).isoformat()
