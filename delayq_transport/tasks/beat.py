"""Beat entries for the web page, through delayq_beat's own store (what ``delayq beat list``,
``enable`` and ``disable`` do), so both front ends show and change the same thing."""

from __future__ import annotations

from typing import Any

from ..core.cron import CronService
from ..core.errors import InvalidInput, SchemaMissing
from ..core.queue import DelayedQueue
from ..transport.message import queue_of_kind
from .service import iso

NEXT_SHOWN = 3


def _store(queue: DelayedQueue) -> Any:
    from delayq_beat.store import BeatStore

    return BeatStore(queue.db, queue.table, ensure_schema=False)


def beat_entries(queue: DelayedQueue, shown: int = NEXT_SHOWN) -> list[dict[str, Any]]:
    """Every entry (DB-backed or installed by a running beat) and its next occurrences."""
    from delayq_beat.cli import _schedule_text
    from delayq_beat.entries import key_prefix

    store = _store(queue)
    try:
        stored = {e.name: e for e in store.entries()}
        installed = {i.name: i for i in store.installed()}
    except SchemaMissing:  # no beat ever migrated this database: no entries
        return []
    out = []
    for name in sorted(set(stored) | set(installed)):
        row, inst = stored.get(name), installed.get(name)
        definition = (row.definition if row else None) or {}
        upcoming: list[str] = []
        if inst is not None:
            rows = CronService(queue.with_kind(inst.kind)).installed(
                key_prefix(name), shown, config_hash=inst.config_hash)
            upcoming = [str(iso(r.scheduled_at_initially_ms)) for r in rows]
        out.append({
            "name": name, "origin": "db" if row and row.definition else "config",
            "enabled": not (row and not row.enabled), "task": definition.get("task"),
            "schedule": _schedule_text(definition) or None,
            "queue": queue_of_kind(inst.kind)[0] if inst else None,
            "config_hash": inst.config_hash[:8] if inst else None, "next": upcoming,
        })
    return out


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
