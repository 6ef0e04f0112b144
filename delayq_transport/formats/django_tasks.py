"""How Django's task framework (``django.tasks``, delayq_transport/django/tasks.py) stores a
task in a ``delayed_queue`` row, for every front end that reads or writes them (the backend and
its worker, the task listings and the web page). No Django import.

* kind ``django:<queue>:<priority>`` (priority -100..100), key: the task's result id;
* periodic tasks: installed by the scheduling engine, their ledger under ``<table>#django``;
* payload: JSON ``{"task": module path, "args", "kwargs", "backend": TASKS alias, "queue",
  "priority", "run_after_us": epoch microseconds or null, "enqueued_at": epoch ms}``;
* an interrupted attempt (its worker killed, or shut down with the task unfinished) is an
  entry of the result's ``errors`` whose class is :class:`TaskInterrupted`, its text saying
  which attempt, on which worker, what happened and when the task runs again;
  :func:`result_truth` is what a reader shows of a stored result (READY, with such an entry,
  while nothing runs a RUNNING one).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from traceback import format_exception_only
from typing import Any

from ..core import LostAttempt, StoredResult

#: Every kind of a django.tasks task starts with it.
KIND_PREFIX = "django:"
#: The scheduling engine's ledger of its periodic tasks is ``<table>#django``
#: (delayq_transport/django/periodic.py), listed as this (``delayq beat list``, the page).
PERIODIC_NAMESPACE = "django"
PERIODIC_TITLE = "django.tasks periodic tasks"
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


class TaskInterrupted(Exception):  # noqa: N818 - Django's TaskError names an exception class
    """An attempt of a task that ended without an outcome: its worker was killed (or lost the
    database for a whole lease), or gave the task back unfinished when it shut down. Never
    raised: the class an entry of a result's ``errors`` names (``TaskError.exception_class``),
    so ``errors`` records every attempt, not only those that raised."""


#: ``TaskError.exception_class_path`` of an interruption.
INTERRUPTED_PATH = f"{TaskInterrupted.__module__}.{TaskInterrupted.__qualname__}"


def _utc(ms: int) -> str:
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")


def interruption(text: str) -> dict[str, str]:
    """An entry of a result's ``errors`` for an interruption, as a worker records an exception
    (``TaskError``): its class path, and its text as a traceback ends with it."""
    return {"exception_class_path": INTERRUPTED_PATH,
            "traceback": "".join(format_exception_only(TaskInterrupted(text)))}


def given_back(attempt: int, worker: str, why: str, at_ms: int, due_ms: int) -> dict[str, str]:
    """A worker gave attempt ``attempt`` back unfinished at ``at_ms``: due again at ``due_ms``."""
    return interruption(f"attempt {attempt} (worker {worker}) was given back unfinished at "
                        f"{_utc(at_ms)}: {why}; it runs again from {_utc(due_ms)}, on the "
                        "first free worker")


def lost(found_ms: int, worker: str) -> LostAttempt:
    """What the next claim records of an attempt that never settled (the template's ``%s``:
    that attempt's number and worker, filled in by the database)."""
    found = f"{_utc(found_ms)} by worker {worker}".replace("%", "%%")
    return LostAttempt(INTERRUPTED_PATH, f"{INTERRUPTED_PATH}: attempt %s (worker %s) "
                       "was interrupted: it never settled and its lease ran out (its worker "
                       "was killed, or lost the database for a whole lease); it ran again at "
                       f"{found}\n")


def unsettled(stored: StoredResult) -> dict[str, str]:
    """The entry a reader shows for a RUNNING result that nothing runs (not stored: the next
    claim records one, :func:`lost`)."""
    attempt, worker = len(stored.worker_ids), (stored.worker_ids or ["?"])[-1]
    if stored.leased and stored.alive_until_ms is not None:
        what = (f"its worker stopped: no sign of life by {_utc(stored.alive_until_ms)}, when "
                "one was due; nothing runs it")
    else:
        what = "its worker let it go without an outcome"
    if stored.due_at_ms is None:
        when = "it is no longer queued, so it does not run again"
    elif stored.leased:
        when = f"it runs again from {_utc(stored.due_at_ms)}, when its lease ends"
    else:
        when = f"it runs again from {_utc(stored.due_at_ms)}"
    return interruption(f"attempt {attempt} (worker {worker}) was interrupted: {what}; {when}")


def result_truth(stored: StoredResult) -> tuple[str | None, list[dict[str, str]]]:
    """The status and errors a reader shows of ``stored``: as stored, but READY with the
    interruption appended while a RUNNING result is one that nothing runs."""
    if stored.interrupted:
        return "READY", [*stored.errors, unsettled(stored)]
    return stored.status, stored.errors
