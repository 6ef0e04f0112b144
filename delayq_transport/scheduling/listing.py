"""Entries and their next installed occurrences, for listings (``delayq beat list``, ``delayq
status``, the web page): every entry a store knows, DB-backed or installed by a scheduler.

Front ends whose ledger lives in a namespace of its own register it (:func:`register_ledger`)
so ``delayq beat list`` shows their entries too (Dramatiq's periodic actors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..core.integrations import CronService
from ..core.queue import DelayedQueue, StoredMessage
from .entries import key_prefix
from .schedules import describe
from .store import EntryStore

#: Namespaced ledgers to list besides Celery beat's: namespace -> title.
LEDGERS: dict[str, str] = {}


def register_ledger(namespace: str, title: str) -> None:
    LEDGERS[namespace] = title


@dataclass(frozen=True)
class ListedEntry:
    name: str
    #: "db" (stored with ``delayq beat add``), "config" (a scheduler's own), or the store a
    #: scheduler reads (``django-celery-beat`` in admin mode, from ``sources``).
    origin: str
    enabled: bool
    task: str
    schedule: str
    config_hash: str | None
    kind: str | None
    upcoming: list[StoredMessage]


@dataclass(frozen=True)
class SourceFields:
    """An entry as the store a scheduler reads it from describes it (django-celery-beat's
    tables in admin mode): the ledger records only what was installed, not the definition."""

    origin: str
    enabled: bool
    task: str
    schedule: str


def list_entries(queue: DelayedQueue, store: EntryStore, shown: int,
                 sources: Mapping[str, SourceFields] | None = None) -> list[ListedEntry]:
    """Every entry of ``store``, sorted by name, with up to ``shown`` installed occurrences.

    ``sources``: a scheduler's entries that are not DB-backed (origin ``config``) take their
    origin and fields from there when their name is found (see
    :func:`.djbeat.listing_fields`)."""
    sources = sources or {}
    stored = {e.name: e for e in store.entries()}
    installed = {i.name: i for i in store.installed()}
    out = []
    for name in sorted(set(stored) | set(installed)):
        row, inst = stored.get(name), installed.get(name)
        definition = (row.definition if row else None) or {}
        upcoming: list[StoredMessage] = []
        if inst is not None:
            upcoming = CronService(queue.with_kind(inst.kind)).installed(
                key_prefix(name), shown, config_hash=inst.config_hash)
        entry = ListedEntry(
            name, "db" if row and row.definition else "config", not (row and not row.enabled),
            str(definition.get("task") or ""), describe(definition),
            inst.config_hash if inst else None, inst.kind if inst else None, upcoming)
        source = sources.get(name) if entry.origin == "config" else None
        if source is not None:
            entry = replace(entry, origin=source.origin, task=source.task,
                            schedule=source.schedule, enabled=entry.enabled and source.enabled)
        out.append(entry)
    return out
