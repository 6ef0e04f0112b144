"""``celery inspect scheduled`` (and Flower's "Scheduled" tab) answered from the table.

A worker on delayq holds no ETA task in memory: a countdown waits as a row until it is due and
is delivered only then, so Celery's own ``scheduled``, which lists the worker's timer, is
empty. When the worker's task consumer is on delayq, :func:`scheduled` adds the rows waiting in
the queues the worker consumes: ETA in the future, held by no consumer, soonest first, at most
:data:`SCHEDULED_LIMIT` per worker (a ``limit`` argument asks for up to :data:`MAX_LIMIT`).
Each entry has the shape of Celery's own reply (``eta``, ``priority``, ``request`` with ``id``,
``name``, ``args``, ``kwargs``, ``type``, ``hostname``, ``time_start``, ``acknowledged``,
``delivery_info``, ``worker_pid``), so Flower and scripts read it as they read a Redis
worker's. ``priority`` is the message's (Celery's own entries give the timer's, always 6).

The read is the task listing's (:meth:`~delayq_transport.core.inspect.Inspector.window`, a
keyset window over the (pKind, scheduledAt) index, the same at 5M rows as at 5k). Workers that
consume the same queue list the same rows: a waiting task belongs to no worker until it is due.

Celery's remote-control commands live in one registry per process (``Panel``); the command is
replaced there when a channel of this transport first starts consuming, and the replacement
gives Celery's own answer first, so a worker of another broker in the same process is
answered as before.
"""

from __future__ import annotations

import threading
from typing import Any

from ..core.inspect import MIN_MS, Inspector, TaskRow
from ..core.queue import from_ms
from ..formats import celery as celery_message
from ..formats.decoders import decode
from .channel import DelayqChannel

#: Waiting tasks one worker lists (soonest first), unless the request asks otherwise.
SCHEDULED_LIMIT = 100
#: The most one request may ask for (the reply travels through the broker as one message).
MAX_LIMIT = 1_000
#: Windows read past rows a consumer holds (few: the workers' prefetch) before giving up.
MAX_WINDOWS = 5

_lock = threading.Lock()


def register() -> None:
    """Put :func:`scheduled` in Celery's remote-control registry (once per process)."""
    from celery.worker import control

    with _lock:
        current = control.Panel.data.get("scheduled")
        if getattr(current, "delayq", False):
            return
        celery_scheduled = current

        def scheduled(state: Any, limit: int | None = None, **kwargs: Any) -> list[Any]:
            """List of currently scheduled ETA/countdown tasks (on delayq: from the table)."""
            found = list(celery_scheduled(state, **kwargs)) if celery_scheduled else []
            channel = task_channel(state)
            if channel is None:
                return found
            hostname = str(getattr(state.consumer, "hostname", "") or "")
            return found + waiting(channel, hostname, limit)

        scheduled.delayq = True  # type: ignore[attr-defined]
        control.Panel.register(scheduled, name="scheduled", alias="dump_schedule",
                               type="inspect", signature="[limit=100]", args=[("limit", int)])


def task_channel(state: Any) -> DelayqChannel | None:
    """The channel of the worker's task consumer, when it is this transport's."""
    consumer = getattr(state, "consumer", None)
    channel = getattr(getattr(consumer, "task_consumer", None), "channel", None)
    return channel if isinstance(channel, DelayqChannel) else None


def waiting(channel: DelayqChannel, hostname: str, limit: int | None = None) -> list[Any]:
    """Celery's ``scheduled`` entries for the rows waiting in ``channel``'s queues."""
    limit = SCHEDULED_LIMIT if limit is None else max(1, min(int(limit), MAX_LIMIT))
    kinds = sorted(channel.consumed_kinds())
    if not kinds:
        return []
    inspector = Inspector(channel.backend.queue)
    later = inspector.now_ms() + 1
    out: list[Any] = []
    after = (MIN_MS, MIN_MS)
    for _ in range(MAX_WINDOWS):
        rows = inspector.window(kinds, after=after, lo=later, budget=limit, with_payload=True)
        out += [e for e in (entry(r, hostname) for r in rows if not r.held) if e is not None]
        if len(out) >= limit or len(rows) < limit:
            break
        after = (rows[-1].scheduled_at_ms, rows[-1].id)
    return out[:limit]


def entry(row: TaskRow, hostname: str) -> dict[str, Any] | None:
    """One waiting row as Celery's ``scheduled`` reply shows a request; None if the row is
    not a Celery task message."""
    message = decode(row.payload or b"")
    if message.format != "celery":
        return None
    as_json = celery_message.decode(row.payload or b"").get("content-type") == \
        "application/json"
    headers, props = message.headers, message.properties
    delivery = props.get("delivery_info") or {}
    return {
        "eta": from_ms(row.scheduled_at_ms).isoformat(),
        "priority": props.get("priority") or 0,
        "request": {
            "id": message.task_id or row.key,
            "name": message.task,
            # A body another serializer wrote is not read here: its repr, as Celery's
            # "safe" form of the same reply gives it.
            "args": message.args if as_json else headers.get("argsrepr"),
            "kwargs": message.kwargs if as_json else headers.get("kwargsrepr"),
            "type": message.task,
            "hostname": hostname,
            "time_start": None,
            "acknowledged": False,
            "delivery_info": {"exchange": delivery.get("exchange", ""),
                              "routing_key": delivery.get("routing_key"),
                              "priority": props.get("priority"),
                              "redelivered": row.redelivered},
            "worker_pid": None,
        },
    }
