"""Beat entries for the web page, through the scheduling engine's store and listing (what
``delayq beat list``, ``enable`` and ``disable`` use), so both front ends show and change the
same thing: Celery beat's entries, and the periodic entries other front ends keep in ledgers of
their own (Dramatiq's periodic actors, django.tasks' periodic tasks: :func:`periodic_ledgers`),
shown with their ledger's title and not enabled or disabled from here (their scheduler's
configuration says)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..core import InvalidInput, SchemaMissing
from ..core.queue import DelayedQueue
from ..formats import decoders, django_tasks, dramatiq
from ..formats.celery import queue_of_kind
from ..scheduling.djbeat import listing_fields
from ..scheduling.listing import LEDGERS, ListedEntry, list_entries
from ..scheduling.store import EntryStore
from .service import iso

NEXT_SHOWN = 3


def _store(queue: DelayedQueue) -> EntryStore:
    return EntryStore(queue.db, queue.table, ensure_schema=False)


def periodic_ledgers() -> dict[str, str]:
    """The scheduling engine's ledgers besides Celery beat's, namespace -> title: those the
    formats name (known to any process, with or without Dramatiq or Django installed), and
    any a front end registered (:func:`~delayq_transport.scheduling.listing.register_ledger`)."""
    return {dramatiq.PERIODIC_NAMESPACE: dramatiq.PERIODIC_TITLE,
            django_tasks.PERIODIC_NAMESPACE: django_tasks.PERIODIC_TITLE, **LEDGERS}


def beat_entries(queue: DelayedQueue, shown: int = NEXT_SHOWN) -> list[dict[str, Any]]:
    """Every entry (DB-backed or installed by a running beat, then those of the other ledgers
    that hold any) and its next occurrences; ``ledger``: None for Celery beat's, else the
    ledger's title."""
    sources = {"": "", **periodic_ledgers()}  # "": Celery beat's own
    out = []
    try:
        fields = listing_fields(queue.db, queue.table)
        for namespace, title in sources.items():
            store = EntryStore(queue.db, queue.table, namespace=namespace, ensure_schema=False)
            if not namespace or store.installed():
                out += [_entry(with_task(e), title or None)
                        for e in list_entries(queue, store, shown, sources=fields)]
    except SchemaMissing:  # no scheduler ever migrated this database: no entries
        return []
    return out


def with_task(e: ListedEntry) -> ListedEntry:
    """An entry whose ledger keeps no definition (a scheduler's own configuration: Dramatiq's
    actors, django.tasks' ``PERIODIC``) named by the task its next occurrence runs."""
    if e.task or not e.upcoming:
        return e
    return replace(e, task=decoders.decode(e.upcoming[0].payload).task or "")


def _entry(e: ListedEntry, ledger: str | None) -> dict[str, Any]:
    return {
        "name": e.name, "origin": e.origin, "enabled": e.enabled, "task": e.task or None,
        "schedule": e.schedule or None,
        "queue": queue_of_kind(e.kind)[0] if e.kind else None,
        "config_hash": e.config_hash[:8] if e.config_hash else None,
        "next": [str(iso(r.scheduled_at_initially_ms)) for r in e.upcoming],
        "ledger": ledger,
    }


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
