"""Beat entries for the web page, through the scheduling engine's store and listing (what
``delayq beat list``, ``enable`` and ``disable`` use), so both front ends show and change the
same thing."""

from __future__ import annotations

from typing import Any

from ..core import InvalidInput, SchemaMissing
from ..core.queue import DelayedQueue
from ..formats.celery import queue_of_kind
from ..scheduling.djbeat import listing_fields
from ..scheduling.listing import list_entries
from ..scheduling.store import EntryStore
from .service import iso

NEXT_SHOWN = 3


def _store(queue: DelayedQueue) -> EntryStore:
    return EntryStore(queue.db, queue.table, ensure_schema=False)


def beat_entries(queue: DelayedQueue, shown: int = NEXT_SHOWN) -> list[dict[str, Any]]:
    """Every entry (DB-backed or installed by a running beat) and its next occurrences."""
    try:
        listed = list_entries(queue, _store(queue), shown,
                              sources=listing_fields(queue.db, queue.table))
    except SchemaMissing:  # no beat ever migrated this database: no entries
        return []
    return [{
        "name": e.name, "origin": e.origin, "enabled": e.enabled, "task": e.task or None,
        "schedule": e.schedule or None,
        "queue": queue_of_kind(e.kind)[0] if e.kind else None,
        "config_hash": e.config_hash[:8] if e.config_hash else None,
        "next": [str(iso(r.scheduled_at_initially_ms)) for r in e.upcoming],
    } for e in listed]


def set_beat_enabled(queue: DelayedQueue, name: str, enabled: bool) -> str:
    """``delayq beat enable|disable NAME``; refuses names no beat or store knows."""
    store = _store(queue)
    known = {e.name for e in store.entries()} | {i.name for i in store.installed()}
    if name not in known:
        raise InvalidInput(f"unknown beat entry {name!r}")
    is_db = store.set_enabled(name, enabled)
    what = "entry" if is_db else "beat_schedule entry (override stored)"
    return f"{what} {name!r} {'enabled' if enabled else 'disabled'}; beats apply it at their " \
           "next refresh"
