"""How Dramatiq queues map to ``delayed_queue`` kinds, and the payload decoder.

Kept free of Dramatiq imports so the CLI, the web page and the Dramatiq broker share it, and
rows can be listed and decoded in a process that has no Dramatiq installed.

* ``dramatiq:<queue>``: due and delayed messages of a queue (a delayed message is a row whose
  ``scheduledAt`` is its eta, so there is no separate delay queue to move it out of);
* ``dramatiq:<queue>:p<N>``: the same for ``broker_priority`` N > 0 (served first, highest
  first, as RabbitMQ's ``x-max-priority`` queues do);
* ``dramatiq:<queue>.XQ``: dead letters, kept until their retention ends, never polled.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["EXCEPTION_OPTION", "FAILURE_OPTIONS", "MAX_PRIORITY_LEVELS", "NAMESPACE",
           "PERIODIC_NAMESPACE", "PERIODIC_OPTION", "PERIODIC_TITLE", "TRACEBACK_OPTION",
           "canonical", "dead_letter_kind", "decode_dramatiq", "kind_for", "kinds_for",
           "queue_of_kind"]

NAMESPACE = "dramatiq"
#: The scheduling engine's ledger of periodic actors is ``<table>#dramatiq``
#: (delayq_transport/dramatiq/ledger.py), listed as this (``delayq beat list``, the page).
PERIODIC_NAMESPACE = "dramatiq"
PERIODIC_TITLE = "Dramatiq periodic actors"
#: Most priority levels a broker accepts: each level is one more index scan per poll.
MAX_PRIORITY_LEVELS = 10
#: Options of a periodic occurrence (the scheduling engine's misfire header).
PERIODIC_OPTION = "delayq_periodic"
#: Options of a dead letter: its final exception in one line and its traceback (the nack writes
#: them beside Dramatiq's own ``traceback``, which it leaves as Retries wrote it;
#: ``DelayqBroker.dead_letters_of`` hands messages back without them, as Dramatiq's brokers do).
EXCEPTION_OPTION = "delayq_exception"
TRACEBACK_OPTION = "delayq_traceback"
FAILURE_OPTIONS = (EXCEPTION_OPTION, TRACEBACK_OPTION)


def canonical(queue_name: str) -> str:
    """Dramatiq's ``q_name``: ``q.DQ`` and ``q.XQ`` are the queue ``q``."""
    if queue_name.endswith((".DQ", ".XQ")):
        return queue_name[:-3]
    return queue_name


def kind_for(queue_name: str, priority: int = 0, namespace: str = NAMESPACE) -> str:
    base = f"{namespace}:{canonical(queue_name)}"
    return f"{base}:p{priority}" if priority else base


def kinds_for(queue_name: str, max_priority: int = 0, namespace: str = NAMESPACE) -> list[str]:
    """Every kind of a queue, highest priority first (the order a consumer drains them)."""
    return [kind_for(queue_name, p, namespace) for p in range(max_priority, -1, -1)]


def dead_letter_kind(queue_name: str, namespace: str = NAMESPACE) -> str:
    return f"{namespace}:{canonical(queue_name)}.XQ"


def queue_of_kind(kind: str, namespace: str = NAMESPACE) -> tuple[str, int, bool] | None:
    """(queue, priority, is_dead_letter) of a Dramatiq kind, or None for other kinds."""
    prefix = f"{namespace}:"
    if not kind.startswith(prefix):
        return None
    rest = kind[len(prefix):]
    if rest.endswith(".XQ"):
        return rest[:-3], 0, True
    queue, sep, level = rest.rpartition(":p")
    if sep and level.isdigit():
        return queue, int(level), False
    return rest, 0, False


def decode_dramatiq(payload: bytes) -> dict[str, Any] | None:
    """A stored row's payload as a Dramatiq message dict, or None if it is not one.

    For listings (``delayq tasks``, the web page): ``name``/``id``/``queue``/``args``/``kwargs``
    plus Dramatiq's own fields; ``eta_ms`` is set for delayed messages.
    """
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not {"actor_name", "queue_name", "message_id"} <= set(data):
        return None
    options = data.get("options") or {}
    return {
        "system": "dramatiq",
        "name": data["actor_name"],
        "id": data["message_id"],
        "queue": canonical(str(data["queue_name"])),
        "args": data.get("args", []),
        "kwargs": data.get("kwargs", {}),
        "options": options,
        "retries": options.get("retries", 0),
        "eta_ms": options.get("eta"),
        "message_timestamp": data.get("message_timestamp"),
        "periodic": options.get(PERIODIC_OPTION),
    }
