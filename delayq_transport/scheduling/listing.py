"""Entries and their next installed occurrences, for listings (``delayq beat list``, ``delayq
status``, the web page): every entry a store knows, DB-backed or installed by a scheduler.

Front ends whose ledger lives in a namespace of its own register it (:func:`register_ledger`)
so ``delayq beat list`` shows their entries too (Dramatiq's periodic actors).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.cron import CronService
from ..core.queue import DelayedQueue
from ..core.types import StoredMessage
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
    origin: str  # "db" (stored with ``delayq beat add``) or "config" (a scheduler's own)
    enabled: bool
    task: str
    schedule: str
    config_hash: str | None
    kind: str | None
    upcoming: list[StoredMessage]


def list_entries(queue: DelayedQueue, store: EntryStore, shown: int) -> list[ListedEntry]:
    """Every entry of ``store``, sorted by name, with up to ``shown`` installed occurrences."""
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
        out.append(ListedEntry(
            name, "db" if row and row.definition else "config", not (row and not row.enabled),
            str(definition.get("task") or ""), describe(definition),
            inst.config_hash if inst else None, inst.kind if inst else None, upcoming))
    return out
