"""Import mode's blind spot, made visible: a source entry changed after ``delayq beat import``.

Once django-celery-beat's tasks are imported, delayq's entries are what runs, and nothing reads
the source again: an edit in the Django admin of an imported task (now disabled there, or not)
changes nothing that runs. That is by design (import mode: delayq's entries are the schedule),
but silently ignoring an edit is how a team loses a schedule change. So:

* :func:`changes` says, per imported entry, whether its source entry changed after the import:
  it is what a re-import would do (:func:`~.imports.plan`): ``update`` (edited there, or enabled
  again there), ``refused`` (edited into something delayq cannot carry), ``kept`` (deleted
  there). The stored definition is what was imported, so no extra record is needed, and an
  entry counts as changed exactly until the next import takes the change.
* ``delayq beat list`` marks those entries (:func:`marks`), and a beat not in admin mode logs
  a warning once per change (:class:`SourceWatch`, which re-reads the tables only when
  django-celery-beat's change mark moved, as admin mode does).

django-celery-beat's tables are looked for in delayq's own database, in the ``search_path``'s
schema (a Django project's usual setup); when they are not there, nothing is compared.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delayq_transport.core import SchemaMissing
from delayq_transport.core.db import Database
from delayq_transport.core.integrations import DjangoBeatTables
from delayq_transport.scheduling import djbeat
from delayq_transport.scheduling.store import EntryStore, StoredEntry

from . import imports
from .carry import Source
from .sources import RowsSource

log = logging.getLogger("delayq_beat")

#: What to do about it, said with every change.
ADVICE = (f"import mode ignores edits in {djbeat.SOURCE}: run `delayq beat import --from "
          f"{djbeat.SOURCE}` again to take them (or edit the entry with `delayq beat`)")


@dataclass(frozen=True)
class Change:
    """How an imported entry's source entry changed: ``short`` for a table cell (``args``,
    ``enabled again``, ``deleted``, ``refused``), ``text`` the sentence for a log or a line."""

    name: str
    short: str
    text: str

    def __str__(self) -> str:
        return f"entry {self.name!r}: {self.text}"


#: The entry options an import derives from django-celery-beat's fields, named as the admin
#: names them (the others are the fields' own names: queue, priority, headers, ...).
OPTION_FIELDS = {"delayq_anchor": "interval start",
                 "delayq_start_time": "start_time", "delayq_expires": "expires",
                 "delayq_one_off": "one_off", "delayq_tz": "timezone"}


def imported(store: EntryStore, kind: str = djbeat.SOURCE) -> dict[str, StoredEntry]:
    """The stored entries an import from ``kind`` wrote."""
    return {e.name: e for e in store.entries() if imports.origin_of(e).get("source") == kind}


def changes(source: Source, store: EntryStore) -> dict[str, Change]:
    """Imported entries whose source entry changed after the import, by name."""
    ours = imported(store, source.kind)
    if not ours:
        return {}
    out: dict[str, Change] = {}
    kind = source.kind
    for step in imports.plan(source, store).steps:
        row = ours.get(step.name)
        if row is None:
            continue
        if step.action == "kept":
            out[step.name] = Change(step.name, "deleted", f"deleted in {kind} after the import")
        elif step.action == "refused":
            out[step.name] = Change(step.name, "refused", f"changed in {kind} after the import;"
                                    f" a re-import would refuse it: {step.reason}")
        elif step.action == "update" and step.entry is not None:
            what = _differences(row, step, kind)
            out[step.name] = Change(step.name, what,
                                    f"changed in {kind} after the import ({what})")
    return out


def _differences(row: StoredEntry, step: imports.Step, kind: str) -> str:
    """The fields a re-import would change, by name (``options.queue``, ``enabled``, ...)."""
    assert step.entry is not None
    now = imports.stored_definition(step.entry, kind, step.disable_source)
    was = row.definition or {}
    names = [k for k in ("task", "schedule", "args", "kwargs") if was.get(k) != now.get(k)]
    old_opts: dict[str, Any] = was.get("options") or {}
    new_opts: dict[str, Any] = now.get("options") or {}
    names += sorted({OPTION_FIELDS.get(k, k) for k in old_opts.keys() | new_opts.keys()
                     if old_opts.get(k) != new_opts.get(k)})
    if imports.origin_of(row).get("disabled_source") and step.entry.source_enabled:
        names.append("enabled again")
    elif row.enabled != step.entry.enabled:
        names.append("enabled" if step.entry.enabled else "disabled")
    return ", ".join(names) or "its definition"


def marks(db: Database, store: EntryStore) -> dict[str, Change]:
    """:func:`changes` for ``delayq beat list``: django-celery-beat's tables in ``db``
    (none there: nothing to compare)."""
    if not imported(store):
        return {}
    try:
        rows = DjangoBeatTables(db).read(force=True).rows or []
    except SchemaMissing:
        return {}
    return changes(RowsSource(rows), store)


class SourceWatch:
    """A beat's check (not in admin mode): the tables re-read only when their change mark
    moved (and once more at the next refresh, since django-celery-beat bumps the mark before
    its save commits), each change warned about once."""

    def __init__(self, db: Database, store: EntryStore, queue_table: str) -> None:
        self.store = store
        self.tables = DjangoBeatTables(db, queue_table)
        self._seen: datetime | None = None
        self._reread = True
        self._warned: dict[str, Change] = {}
        self._absent = False

    def check(self) -> dict[str, Change]:
        """The changes not warned about yet (each logged as a warning)."""
        if self._absent or not imported(self.store):
            return {}
        try:
            snapshot = self.tables.read(self._seen, force=self._reread)
        except SchemaMissing:
            self._absent = True  # imported from elsewhere: no tables here to compare with
            log.info("delayq beat: %s's tables are not in this database: imported entries "
                     "are not compared with their source", djbeat.SOURCE)
            return {}
        self._reread = snapshot.mark != self._seen
        self._seen = snapshot.mark
        if snapshot.rows is None:
            return {}
        now = changes(RowsSource(snapshot.rows), self.store)
        new = {name: c for name, c in now.items() if self._warned.get(name) != c}
        self._warned = now
        for _, change in sorted(new.items()):
            log.warning("delayq beat: %s; %s", change, ADVICE)
        return new
