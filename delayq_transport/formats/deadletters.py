"""The dead-letter policy of every front end, in one place: which kinds hold dead letters, how
long one is kept, the job that expires them and how a dead letter's kind is described.

A dead letter is a row moved (never copied) to a kind ending in :data:`SUFFIX`, where no
consumer polls; its ``scheduledAt`` becomes the end of its retention, fixed when it was
dead-lettered. Front ends only choose the kind and the retention:

* Celery (the kombu transport): a message rejected without requeue (``Reject(requeue=False)``,
  an unregistered task, a failed ``acks_late`` task with ``task_acks_on_failure_or_timeout``
  off: what RabbitMQ would dead-letter) moves to ``<queue>.XQ``, kept the transport option
  ``dead_letter_retention``;
* Dramatiq: a message that failed for good moves to ``dramatiq:<queue>.XQ``, kept the broker's
  ``dead_message_ttl``;
* django.tasks: a row a worker cannot read as a task moves to ``django.XQ``, kept the backend's
  ``DEAD_LETTER_RETENTION``.

:func:`expiry_job` is the one expiry: every consuming process of any front end runs it on its
session's thread, and it deletes the dead letters of *every* front end whose retention ended
(one loose index scan for the kinds present, one delete), so dead letters expire while any
worker runs. No other kind ends in the suffix: Dramatiq's queue names drop it, django.tasks
kinds end in a priority, and a Celery queue named so is refused (:func:`refuse_queue`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core import InvalidInput
from ..core.queue import DelayedQueue, expire, kinds_ending
from . import dramatiq

#: What ends the kind of every dead letter (Dramatiq's name for its dead-letter queue).
SUFFIX = ".XQ"
#: Retention when a front end is not told otherwise: 7 days (Dramatiq's default).
DEFAULT_RETENTION_S = 7 * 86400.0
#: How often a consuming process deletes the dead letters whose retention ended, at most (a
#: shorter retention is also the interval: a letter outlives its retention by at most that).
EXPIRE_INTERVAL_S = 60.0
#: ... and at least.
MIN_EXPIRE_INTERVAL_S = 1.0
#: django.tasks' dead letters (rows of its kinds that are not a task).
DJANGO_KIND = "django.XQ"


def is_dead_letter_kind(kind: str) -> bool:
    return kind.endswith(SUFFIX)


def celery_kind(queue: str) -> str:
    """Where the transport moves a message of ``queue`` rejected without requeue."""
    return f"{queue}{SUFFIX}"


def refuse_queue(queue: str) -> None:
    """A Celery queue cannot be named like a dead-letter kind: its messages would be taken for
    dead letters and expired."""
    if is_dead_letter_kind(queue):
        raise InvalidInput(f"queue {queue!r}: a name ending in {SUFFIX} holds dead letters "
                           "(docs/how-to/manage-tasks.md#dead-letters); choose another name")


@dataclass(frozen=True)
class DeadKind:
    """What a dead-letter kind holds: its front end, its queue and the kind a requeue moves a
    letter back to (None: not a task, it can only be deleted)."""

    front_end: str
    queue: str
    requeue_kind: str | None


def describe(kind: str) -> DeadKind | None:
    """The dead-letter kind ``kind`` described, None for any other kind."""
    if not is_dead_letter_kind(kind):
        return None
    if kind == DJANGO_KIND:
        return DeadKind("django.tasks", "django", None)
    parsed = dramatiq.queue_of_kind(kind)
    if parsed is not None:
        return DeadKind("dramatiq", parsed[0], dramatiq.kind_for(parsed[0]))
    queue = kind[: -len(SUFFIX)]
    return DeadKind("celery", queue, queue)


def expire_all(queue: DelayedQueue) -> int:
    """Delete every front end's dead letters whose retention ended; returns how many."""
    return expire(queue, kinds_ending(queue, SUFFIX))


def expiry_job(queue: DelayedQueue, retention_s: float) -> tuple[float, Callable[[], int]]:
    """The session job (interval, call) every front end's consuming process runs, given the
    retention it keeps its own dead letters."""
    interval = min(EXPIRE_INTERVAL_S, max(MIN_EXPIRE_INTERVAL_S, retention_s or EXPIRE_INTERVAL_S))
    return interval, lambda: expire_all(queue)
