"""DB-backed scheduling state: runtime entries and the ledger of installed entries.

Small tables, shared by every queue table of a database and keyed by ``tableName`` like
delayq's migration ledger: ``delayq_schedule_entries`` (entries added with ``delayq beat add`` or
:meth:`EntryStore.add`, plus enable/disable overrides of configured entries),
``delayq_schedule_installed`` (which entries have occurrences installed, in which kind, under which
config hash and up to when) and ``delayq_schedule_schedulers`` (each scheduler's configuration
and heartbeat: :mod:`.authority`). The ledger is what lets a scheduler that restarts with an entry
removed from its configuration find and uninstall that entry's rows, and what the outage
catch-up compares and sets.

Each front end keeps its rows in a namespace of its own (Celery beat: none, Dramatiq's periodic
actors: ``dramatiq``, stored as ``<table>#dramatiq``), because an installer uninstalls every
ledger entry that is not in the configuration it is given. The tables and their statements
belong to the core (:mod:`delayq_transport.core.integrations`, migrations 10, 16 and 17).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..core import InvalidInput
from ..core.db import Database
from ..core.integrations import EntryRow, FirstInstall, InstalledRow, PeriodicStore, Standing
from ..core.schema import ensure_schema as ensure_current_schema
from .entries import EntrySpec, key_prefix, make_spec, storable_options
from .schedules import schedule_from_json, schedule_to_json

#: The migration after which the engine's tables are as this release reads them: created by
#: migration 10 (as ``delayq_beat_*``), named ``delayq_schedule_*`` by migration 16, the
#: schedulers' heartbeats by migration 18.
SCHEDULE_MIGRATION_VERSION = 17


@dataclass(frozen=True)
class StoredEntry(EntryRow):
    """A row of ``delayq_schedule_entries``; ``definition`` is None for an enable/disable
    override."""

    def spec(self, **defaults: Any) -> EntrySpec:
        """The validated entry; raises InvalidInput naming the entry if the row is bad."""
        d = self.definition or {}
        try:
            sched = schedule_from_json(d.get("schedule") or {})
        except InvalidInput as exc:
            raise InvalidInput(f"beat entry {self.name!r}: {exc}") from exc
        return make_spec(self.name, d.get("task"), sched, d.get("args") or (), d.get("kwargs"),
                         d.get("options"), source="db", **defaults)


#: A ledger row: which entry is installed in which kind, under which config hash, until when.
InstalledEntry = InstalledRow


class EntryStore:
    """DB-backed entries and the ledger of one queue table, in one front end's namespace;
    changes to entries are picked up by every scheduler within one refresh."""

    def __init__(self, db: Database, table: str = "delayed_queue", *, namespace: str = "",
                 ensure_schema: bool = True) -> None:
        self.db = db
        self.rows = PeriodicStore(db, table, namespace=namespace)
        self.table = table
        self.namespace = namespace
        if ensure_schema:
            ensure_current_schema(db, table)

    def add(self, name: str, task: str, schedule: object, args: Sequence[Any] = (),
            kwargs: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
            *, enabled: bool = True) -> EntrySpec:
        """Add or replace an entry; validated first, so a bad entry is never stored."""
        spec = make_spec(name, task, schedule, args, kwargs, options, source="db")
        options = storable_options(options or {})  # keeps the delayq_* options (misfire, ...)
        definition = {"task": spec.task, "schedule": schedule_to_json(spec.schedule),
                      "args": list(spec.args), "kwargs": dict(spec.kwargs), "options": options}
        self.rows.upsert_entry(name, json.dumps(definition), enabled)
        return spec

    def put_many(self, rows: Sequence[tuple[str, Mapping[str, Any], bool]]) -> None:
        """Store (name, definition, enabled) of many entries in one statement: all or none.
        Definitions are stored as given (validate them first, as :meth:`add` does)."""
        for name, _, _ in rows:
            key_prefix(name)
        self.rows.upsert_entries([(n, json.dumps(d, sort_keys=True), e) for n, d, e in rows])

    def remove_many(self, names: Sequence[str]) -> list[str]:
        """Remove these entries in one statement; returns the names that existed."""
        return self.rows.delete_entries(list(names))

    def remove(self, name: str) -> bool:
        key_prefix(name)
        return self.rows.delete_entry(name)

    def set_enabled(self, name: str, enabled: bool) -> bool:
        """Returns whether ``name`` is a DB-backed entry (else the row overrides the config)."""
        key_prefix(name)
        return self.rows.set_enabled(name, enabled)

    def enable(self, name: str) -> bool:
        return self.set_enabled(name, True)

    def disable(self, name: str) -> bool:
        return self.set_enabled(name, False)

    def entries(self) -> list[StoredEntry]:
        return [StoredEntry(r.name, r.definition, r.enabled, r.updated_at_ms)
                for r in self.rows.entries()]

    def installed(self) -> list[InstalledEntry]:
        return self.rows.installed()

    def record_installed(self, rows: Sequence[InstalledEntry]) -> None:
        self.rows.record_installed(rows)

    def forget_installed(self, names: Sequence[str]) -> None:
        self.rows.forget_installed(names)

    @property
    def ledger_name(self) -> str:
        """``<table>`` or ``<table>#<namespace>``: the rows of this front end and table."""
        return self.rows.ledger_name

    def heartbeat(self, scheduler: str, process: str, config_hash: str, entries: int, *,
                  alive_ms: int, keep_ms: int, now_ms: int | None = None) -> Standing:
        """One scheduler's heartbeat and the configuration in force (see
        :meth:`~delayq_transport.core.integrations.PeriodicStore.heartbeat`)."""
        return self.rows.heartbeat(scheduler, process, config_hash, entries,
                                   alive_ms=alive_ms, keep_ms=keep_ms, now_ms=now_ms)

    def renew(self, scheduler: str, *, alive_ms: int, now_ms: int | None = None) -> bool:
        return self.rows.renew(scheduler, alive_ms=alive_ms, now_ms=now_ms)

    def retire(self, scheduler: str, now_ms: int | None = None) -> None:
        self.rows.retire(scheduler, now_ms)

    def first_install(self, name: str, kind: str, config_hash: str,
                      now_ms: int | None = None) -> FirstInstall:
        """When ``name`` was first installed under ``config_hash``, claimed once for every
        scheduler (see :meth:`~delayq_transport.core.integrations.PeriodicStore.first_install`)."""
        return self.rows.first_install(name, kind, config_hash, now_ms)

    def catch_up(self, row: InstalledEntry, until_ms: int, gap_end_ms: int,
                 offers: Sequence[tuple[str, bytes, datetime]], *, min_lead_ms: int,
                 now_ms: int | None = None) -> list[str] | None:
        """Claim a gap and install its runs with the new horizon, once (see
        :meth:`~delayq_transport.core.integrations.PeriodicStore.catch_up`)."""
        return self.rows.catch_up(row, until_ms, gap_end_ms, offers, min_lead_ms=min_lead_ms,
                                  now_ms=now_ms)
