"""Persistence of periodic entries: the schedule-entry table, the ledger of installed entries,
the misfire queries over installed occurrences, and the catch-up of occurrences never installed
(one statement that moves an entry's ledger row and writes the runs, so it happens once).

Celery beat (``delayq_beat``) stores its DB-backed entries and enable/disable overrides here,
and records which entries have occurrences installed under which config hash, so an entry
removed from the configuration is found and uninstalled after a restart; every scheduler
records its heartbeat and configuration, from which schedulers of different configurations
agree on the one in force (:meth:`PeriodicStore.heartbeat`). Three tables, shared by every
queue table of a database and keyed by ``tableName`` like the migration ledger; declared in
:mod:`..schema.migrations` (migrations 10 and 17). Occurrences themselves are ordinary queue
rows installed by :class:`~.cron.CronService`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..db.database import Database
from ..db.queries import Queries
from ..queue.timeutil import to_ms
from ..queue.validate import validate_key, validate_kind, validate_payload

if TYPE_CHECKING:
    from ..queue.handle import QueueHandle

@dataclass(frozen=True)
class EntryRow:
    """A row of the entry table; ``definition`` is None for an enable/disable override."""

    name: str
    definition: dict[str, Any] | None
    enabled: bool
    updated_at_ms: int


@dataclass(frozen=True)
class InstalledRow:
    name: str
    kind: str
    config_hash: str
    installed_until_ms: int
    updated_at_ms: int
    #: When this configuration was first installed (recorded by :meth:`first_install` only).
    first_installed_ms: int | None = None


@dataclass(frozen=True)
class FirstInstall:
    """What :meth:`PeriodicStore.first_install` found: the recorded time, the ledger's
    ``installedUntil`` after the claim, and whether this call made the claim."""

    at_ms: int
    installed_until_ms: int
    inserted: bool


@dataclass(frozen=True)
class Standing:
    """What one scheduler's heartbeat found (``schedule_scheduler_heartbeat``): the clock,
    the configuration in force and when it was first seen, when the scheduler's own was, and
    the schedulers alive that do not follow the one in force yet (``process (hash)``)."""

    now_ms: int
    in_force: str
    in_force_since_ms: int
    own_since_ms: int
    lagging: tuple[str, ...]
    others: int


#: Separates a queue table's name from a ledger namespace in ``tableName``.
NAMESPACE_SEP = "#"


class PeriodicStore:
    """Entries and the installed ledger of one queue table (the database clock stamps rows).

    ``namespace`` keeps one front end's rows apart from another's (``<table>#<namespace>``):
    an installer uninstalls every ledger entry its configuration lacks."""

    def __init__(self, db: Database, table: str = "delayed_queue", *,
                 namespace: str = "") -> None:
        self.db = db
        self.q = Queries(table)
        self.table = self.q.table
        self.ledger_name = f"{self.table}{NAMESPACE_SEP}{namespace}" if namespace else self.table

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"table_name": self.ledger_name, "now": None, **extra}

    def upsert_entry(self, name: str, definition_json: str, enabled: bool) -> None:
        self.db.execute(self.q["schedule_entry_upsert"], self._params(
            name=name, definition=definition_json, enabled=enabled))

    def upsert_entries(self, rows: Sequence[tuple[str, str, bool]]) -> None:
        """(name, definition JSON, enabled) of many entries, in one statement: all or none."""
        if rows:
            self.db.execute(self.q["schedule_entries_upsert_many"], self._params(
                names=[r[0] for r in rows], definitions=[r[1] for r in rows],
                enableds=[r[2] for r in rows]))

    def delete_entries(self, names: Sequence[str]) -> list[str]:
        """Remove these entries in one statement; returns the names that existed."""
        if not names:
            return []
        rows = self.db.fetchall(self.q["schedule_entries_delete_many"],
                                self._params(names=list(names)))
        return [r[0] for r in rows]

    def delete_entry(self, name: str) -> bool:
        return self.db.execute(self.q["schedule_entry_delete"], self._params(name=name)) > 0

    def set_enabled(self, name: str, enabled: bool) -> bool:
        """Returns whether ``name`` has a stored definition (else the row is an override)."""
        row = self.db.fetchone(self.q["schedule_entry_set_enabled"],
                               self._params(name=name, enabled=enabled))
        return bool(row and row[0])

    def entries(self) -> list[EntryRow]:
        rows = self.db.fetchall(self.q["schedule_entries_list"], self._params())
        return [EntryRow(r[0], r[1], bool(r[2]), int(r[3])) for r in rows]

    def installed(self) -> list[InstalledRow]:
        rows = self.db.fetchall(self.q["schedule_installed_list"], self._params())
        return [InstalledRow(r[0], r[1], r[2], int(r[3]), int(r[4]),
                             None if r[5] is None else int(r[5])) for r in rows]

    def first_install(self, name: str, kind: str, config_hash: str,
                      now_ms: int | None = None) -> FirstInstall:
        """Claim (or read) when ``name`` was first installed under ``config_hash``: the same
        answer for every scheduler, whichever claims first (``schedule_first_install``)."""
        row = self.db.fetchone(self.q["schedule_first_install"], self._params(
            name=name, kind=validate_kind(kind), hash=config_hash, now=now_ms))
        assert row is not None
        return FirstInstall(int(row[0]), int(row[1]), bool(row[2]))

    def in_use(self) -> bool:
        """Whether this table has any entry or installed occurrence (cheap: two EXISTS)."""
        row = self.db.fetchone(self.q["schedule_tables_in_use"], self._params())
        return bool(row and row[0])

    def heartbeat(self, scheduler: str, process: str, config_hash: str, entries: int, *,
                  alive_ms: int, keep_ms: int, now_ms: int | None = None) -> Standing:
        """Record one scheduler of this ledger (alive for ``alive_ms``) and read which
        configuration is in force, in one statement (``schedule_scheduler_heartbeat``)."""
        row = self.db.fetchone(self.q["schedule_scheduler_heartbeat"], self._params(
            scheduler=scheduler, process=process, hash=config_hash, entries=entries,
            alive_ms=alive_ms, keep_ms=keep_ms, now=now_ms))
        assert row is not None
        return Standing(int(row[0]), str(row[1]), int(row[2]), int(row[3]), tuple(row[4]),
                        int(row[5]))

    def renew(self, scheduler: str, *, alive_ms: int, now_ms: int | None = None) -> bool:
        """Keep a scheduler alive for ``alive_ms`` more, if it still is
        (``schedule_scheduler_renew``); False: its heartbeat had lapsed."""
        return self.db.fetchone(self.q["schedule_scheduler_renew"], self._params(
            scheduler=scheduler, alive_ms=alive_ms, now=now_ms)) is not None

    def retire(self, scheduler: str, now_ms: int | None = None) -> None:
        """The scheduler stops: its heartbeat lapses now (``schedule_scheduler_retire``)."""
        self.db.execute(self.q["schedule_scheduler_retire"],
                        self._params(scheduler=scheduler, now=now_ms))

    def record_installed(self, rows: Sequence[InstalledRow]) -> None:
        """installedUntil only grows for an unchanged config (see the statement)."""
        if rows:
            self.db.execute(self.q["schedule_installed_upsert"], self._params(
                names=[r.name for r in rows], kinds=[r.kind for r in rows],
                hashes=[r.config_hash for r in rows],
                untils=[r.installed_until_ms for r in rows]))

    def forget_installed(self, names: Sequence[str]) -> None:
        if names:
            self.db.execute(self.q["schedule_installed_delete"], self._params(names=list(names)))

    def catch_up(self, row: InstalledRow, until_ms: int, gap_end_ms: int,
                 offers: Sequence[tuple[str, bytes, datetime]], *, min_lead_ms: int,
                 now_ms: int | None = None) -> list[str] | None:
        """Install ``offers`` (one kind: ``row.kind``) if this call moves the ledger row of
        ``row`` from the ``installedUntil`` it holds to ``until_ms``; None if another scheduler
        moved it first. Offers up to ``gap_end_ms`` are the runs of never-installed
        occurrences and are inserted even though due; later ones keep ``min_lead_ms``.

        One statement (``schedule_catch_up``), so the compare-and-set on the ledger row is what
        makes a gap caught up once however many schedulers restart together, and a crash
        cannot leave the ledger moved with its rows missing. Returns the keys created."""
        keys = [validate_key(key) for key, _, _ in offers]
        payloads = [validate_payload(payload) for _, payload, _ in offers]
        ats = [to_ms(at, what="occurrence") for _, _, at in offers]
        found = self.db.fetchone(self.q["schedule_catch_up"], self._params(
            name=row.name, kind=validate_kind(row.kind), hash=row.config_hash,
            seen_until=row.installed_until_ms, until=until_ms, gap_end=gap_end_ms,
            keys=keys, payloads=payloads, ats=ats, min_lead_ms=min_lead_ms, now=now_ms))
        if not found or not found[0]:
            return None
        return list(found[1])


def sweep_misfired(queue: QueueHandle, kinds: Sequence[str], patterns: Sequence[str],
                   policies: Sequence[str], grace_ms: Sequence[int]) -> list[tuple[str, str]]:
    """Delete waiting occurrences due longer ago than their grace, per entry policy (``skip``:
    all of them; ``coalesce``: all but the newest). Returns (key, kind) of each deleted row."""
    params = {"kinds": list(kinds), "patterns": list(patterns), "policies": list(policies),
              "grace_ms": [int(g) for g in grace_ms],
              "now": queue.clock_ms()}  # the queue's one clock (the database's unless injected)
    rows = queue.db.fetchall(queue.queries["schedule_misfire_sweep"], params)
    return [(r[0], r[1]) for r in rows]


def newer_occurrence_due(queue: QueueHandle, kind: str, pattern: str, at_ms: int,
                         now_ms: int) -> bool:
    """Whether an occurrence matching ``pattern`` (LIKE, escaped) newer than ``at_ms`` is due."""
    row = queue.db.fetchone(queue.queries["schedule_newer_due"],
                            {"kind": kind, "pattern": pattern, "at_ms": at_ms, "now": now_ms})
    return bool(row and row[0])
