"""DB-backed beat state: runtime schedule entries and the ledger of installed entries.

Two small tables, shared by every queue table of a database and keyed by ``tableName`` like
delayq's migration ledger: ``delayq_beat_entries`` (entries added with ``delayq beat add`` or
:class:`BeatStore`, plus enable/disable overrides of ``beat_schedule`` entries) and
``delayq_beat_installed`` (which entries have occurrences installed, in which kind and under
which config hash). The ledger is what lets a beat that restarts with an entry removed from
its configuration find and uninstall that entry's rows.

Importing this module registers migration 10 with :mod:`delayq_transport.core.schema`, so
``delayq migrate`` (whose CLI loads ``delayq_beat.cli``) and every beat create the tables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import BigInteger, Boolean, Column, MetaData, String, Table, Text
from sqlalchemy.dialects.postgresql import JSONB

from delayq_transport.core.db import Database
from delayq_transport.core.errors import InvalidInput
from delayq_transport.core.queries import Queries
from delayq_transport.core.schema import Migration, ddl, migrate, register_migration

from .entries import EntrySpec, key_prefix, make_spec, schedule_from_json, schedule_to_json

ENTRIES_TABLE = "delayq_beat_entries"
INSTALLED_TABLE = "delayq_beat_installed"
BEAT_MIGRATION_VERSION = 10


def beat_tables(metadata: MetaData | None = None) -> list[Table]:
    metadata = metadata or MetaData()
    entries = Table(
        ENTRIES_TABLE, metadata,
        Column("tableName", String(31), primary_key=True),
        Column("name", Text, primary_key=True),
        Column("definition", JSONB, nullable=True),
        Column("enabled", Boolean, nullable=False, server_default="true"),
        Column("updatedAt", BigInteger, nullable=False),
    )
    installed = Table(
        INSTALLED_TABLE, metadata,
        Column("tableName", String(31), primary_key=True),
        Column("name", Text, primary_key=True),
        Column("kind", String(100), nullable=False),
        Column("configHash", String(32), nullable=False),
        Column("installedUntil", BigInteger, nullable=False),
        Column("updatedAt", BigInteger, nullable=False),
    )
    return [entries, installed]


def _create_beat_tables(conn: psycopg.Connection[Any], q: Queries) -> None:
    for table in beat_tables():
        for statement in ddl(table):
            conn.execute(statement)


BEAT_MIGRATION = Migration(
    BEAT_MIGRATION_VERSION, "delayq_beat: DB-backed entries and installed-entry ledger",
    _create_beat_tables,
)
register_migration(BEAT_MIGRATION)


@dataclass(frozen=True)
class StoredEntry:
    """A row of ``delayq_beat_entries``; ``definition`` is None for an enable/disable override."""

    name: str
    definition: Mapping[str, Any] | None
    enabled: bool
    updated_at_ms: int

    def spec(self, **defaults: Any) -> EntrySpec:
        """The validated entry; raises InvalidInput naming the entry if the row is bad."""
        d = self.definition or {}
        try:
            sched = schedule_from_json(d.get("schedule") or {})
        except InvalidInput as exc:
            raise InvalidInput(f"beat entry {self.name!r}: {exc}") from exc
        return make_spec(self.name, d.get("task"), sched, d.get("args") or (), d.get("kwargs"),
                         d.get("options"), source="db", **defaults)


@dataclass(frozen=True)
class InstalledEntry:
    name: str
    kind: str
    config_hash: str
    installed_until_ms: int
    updated_at_ms: int


class BeatStore:
    """Python API of DB-backed entries; changes are picked up by every beat within one refresh."""

    def __init__(self, db: Database, table: str = "delayed_queue", *, ensure_schema: bool = True):
        self.db = db
        self.queries = Queries(table)
        self.table = table
        if ensure_schema:
            migrate(db, table)

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"table_name": self.table, "now": None, **extra}

    def add(
        self,
        name: str,
        task: str,
        schedule: object,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        *,
        enabled: bool = True,
    ) -> EntrySpec:
        """Add or replace an entry; validated first, so a bad entry is never stored."""
        spec = make_spec(name, task, schedule, args, kwargs, options, source="db")
        options = dict(options or {})  # keep delayq_misfire/delayq_grace in the stored options
        definition = {"task": spec.task, "schedule": schedule_to_json(spec.schedule),
                      "args": list(spec.args), "kwargs": dict(spec.kwargs), "options": options}
        self.db.execute(self.queries["beat_entry_upsert"], self._params(
            name=name, definition=json.dumps(definition), enabled=enabled))
        return spec

    def remove(self, name: str) -> bool:
        key_prefix(name)
        return self.db.execute(self.queries["beat_entry_delete"], self._params(name=name)) > 0

    def set_enabled(self, name: str, enabled: bool) -> bool:
        """Returns whether ``name`` is a DB-backed entry (else the row overrides beat_schedule)."""
        key_prefix(name)
        row = self.db.fetchone(self.queries["beat_entry_set_enabled"],
                               self._params(name=name, enabled=enabled))
        return bool(row and row[0])

    def enable(self, name: str) -> bool:
        return self.set_enabled(name, True)

    def disable(self, name: str) -> bool:
        return self.set_enabled(name, False)

    def entries(self) -> list[StoredEntry]:
        rows = self.db.fetchall(self.queries["beat_entries_list"], self._params())
        return [StoredEntry(r[0], r[1], bool(r[2]), int(r[3])) for r in rows]

    def installed(self) -> list[InstalledEntry]:
        rows = self.db.fetchall(self.queries["beat_installed_list"], self._params())
        return [InstalledEntry(r[0], r[1], r[2], int(r[3]), int(r[4])) for r in rows]

    def record_installed(self, rows: Sequence[InstalledEntry]) -> None:
        if not rows:
            return
        self.db.execute(self.queries["beat_installed_upsert"], self._params(
            names=[r.name for r in rows], kinds=[r.kind for r in rows],
            hashes=[r.config_hash for r in rows], untils=[r.installed_until_ms for r in rows]))

    def forget_installed(self, names: Sequence[str]) -> None:
        if names:
            self.db.execute(self.queries["beat_installed_delete"], self._params(names=list(names)))
