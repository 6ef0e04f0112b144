"""django-celery-beat's periodic tasks in the engine's terms, for ``delayq beat import --from
django-celery-beat`` and for a beat in admin mode (``delayq_beat_source``), which reads the
tables at every refresh so the Django admin stays the editing UI.

Field by field (:func:`carried`), as django-celery-beat's ``ModelEntry`` reads a row:

* ``interval`` (every, period) -> an interval counted from the task's last run, else from its
  start time, else from when it was last changed (django-celery-beat's ``date_changed``);
  ``crontab`` -> a crontab read in its own ``timezone`` (DST included); ``solar`` -> the same
  event at the same place; ``clocked`` -> one instant;
* ``args``, ``kwargs``, ``headers`` (JSON text), ``queue``, ``exchange``, ``routing_key``,
  ``priority`` -> the same; ``expires`` -> the entry's end and each message's expiry,
  ``expire_seconds`` -> each message's expiry (``expires or expire_seconds``, as
  django-celery-beat sends it); ``start_time`` -> the entry's start; ``one_off`` -> a one-off
  entry, disabled when it already ran; ``enabled`` -> the same;
* the entry's name is its ``periodic_task_name`` header (every delayq beat message carries it).

A task that cannot be carried (no schedule or several, JSON that is not a list or an object, an
interval under a second, an unknown time zone, ...) is refused with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..core import DelayqError, InvalidInput, PermissionDenied, SchemaMissing
from ..core.db import Database
from ..core.integrations import DjangoBeatTables
from ..core.integrations import DjangoBeatTask as TaskRow
from ..core.queue import DelayedQueue, to_ms
from .carried import Carried, Refused, interval_anchor, json_value
from .listing import SourceFields
from .schedules import Clocked, Crontab, Interval, Schedule, Solar, describe, schedule_to_json

log = logging.getLogger(__name__)

SOURCE = "django-celery-beat"
#: Seconds of django-celery-beat's IntervalSchedule periods.
PERIODS = {"days": 86400.0, "hours": 3600.0, "minutes": 60.0, "seconds": 1.0,
           "microseconds": 1e-6}
#: A beat in admin mode reads every task at least this often even when the change mark did not
#: move (a ``QuerySet.update()`` without ``PeriodicTasks.update_changed()`` moves no mark).
FULL_READ_EVERY = 10


def carried(row: TaskRow, *, live: bool = False) -> Carried:
    """The task as a :class:`Carried` entry, or :class:`Refused` naming why not. ``live``
    (admin mode): the interval anchor is normalised so run history does not change the entry."""
    name = row.name
    if row.schedules != 1:
        raise Refused(name, f"has {row.schedules} schedules (django-celery-beat runs a task "
                            "with exactly one of interval, crontab, solar, clocked)")
    args = json_value(name, "args", row.args, list, [])
    kwargs = json_value(name, "kwargs", row.kwargs, dict, {})
    options: dict[str, Any] = {k: v for k, v in (
        ("queue", row.queue), ("exchange", row.exchange), ("routing_key", row.routing_key),
        ("priority", row.priority)) if v is not None and v != ""}
    options["headers"] = json_value(name, "headers", row.headers, dict, {})
    notes: list[str] = []
    expiry = row.expires or row.expire_seconds
    if expiry:
        options["expires"] = expiry
    if row.expires is not None:
        options["delayq_expires"] = row.expires
    if row.start_time is not None:
        options["delayq_start_time"] = row.start_time
    if row.one_off:
        options["delayq_one_off"] = True
    if row.priority is not None and row.priority > 9:
        notes.append(f"priority {row.priority} is served as 9 (delayq's and Redis' range 0-9)")
    sched = _schedule(row, options, notes, live)
    ran = row.one_off and row.total_run_count > 0
    if ran:
        notes.append("one-off that already ran: disabled")
    history = {"last_run_at": row.last_run_at, "total_run_count": row.total_run_count,
               "description": row.description, "enabled": row.enabled, "ran": ran}
    enabled = row.enabled and not ran
    return Carried(name, row.task, sched, tuple(args), kwargs, options, enabled, tuple(notes),
                   history).validated()


def _schedule(row: TaskRow, options: dict[str, Any], notes: list[str], live: bool) -> Schedule:
    name = row.name
    try:
        if row.every is not None:
            return _interval(row, options, notes, live)
        if row.minute is not None:
            options["delayq_tz"] = _zone(name, row.timezone or "UTC")
            notes.append(f"crontab read in {options['delayq_tz']}")
            return Crontab.of(row.minute, row.hour or "*", row.day_of_week or "*",
                              row.day_of_month or "*", row.month_of_year or "*")
        if row.event is not None:
            return Solar(row.event, float(row.latitude or 0), float(row.longitude or 0))
        if row.clocked_time is not None:
            return Clocked(to_ms(row.clocked_time, what="clocked_time"))
    except Refused:
        raise
    except (InvalidInput, ValueError) as exc:
        raise Refused(name, str(exc)) from exc
    raise Refused(name, "its schedule row is missing")


def _interval(row: TaskRow, options: dict[str, Any], notes: list[str], live: bool) -> Interval:
    unit = PERIODS.get(str(row.period))
    if unit is None:
        raise Refused(row.name, f"unknown interval period {row.period!r}")
    seconds = float(row.every or 0) * unit
    if seconds < 1:
        raise Refused(row.name, f"every {row.every} {row.period}: delayq's shortest interval "
                                "is 1 second")
    sched = Interval.of(seconds)
    anchor, note = interval_anchor(sched.seconds, row.last_run_at, row.start_time,
                                   row.date_changed, normalize=live)
    if anchor is not None:
        options["delayq_anchor"] = anchor
    notes.append(note)
    return sched


def _zone(name: str, zone: str) -> str:
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise Refused(name, f"unknown time zone {zone!r} of its crontab") from exc
    return zone


class DjangoBeatSource:
    """Admin mode's view of django-celery-beat's tables: every enabled task as a
    :class:`Carried` entry (or the error that refuses it), re-read only when the change mark
    moved, and then once more at the next refresh (django-celery-beat bumps the mark before
    its save commits, so the first read may miss the row it announces), plus every
    :data:`FULL_READ_EVERY` refreshes whatever the mark says."""

    def __init__(self, db: Database, queue_table: str = "delayed_queue", *,
                 schema: str | None = None) -> None:
        self.tables = DjangoBeatTables(db, queue_table, schema=schema)
        self._seen: datetime | None = None
        self._reread = True
        self._reads = 0
        self._entries: dict[str, Carried | InvalidInput] = {}
        #: Whether the last :meth:`entries` call read the tasks (False: the cache served).
        self.read_rows = False
        #: The ``task`` column of every enabled task last read, by name (a front end that runs
        #: only some tasks, django.tasks', tells its own from it, refused ones included).
        self.tasks: dict[str, str] = {}

    def entries(self) -> dict[str, Carried | InvalidInput]:
        """Enabled tasks by name; a task that cannot be carried maps to its :class:`Refused`."""
        self._reads += 1
        force = self._reread or self._reads % FULL_READ_EVERY == 0
        snapshot = self.tables.read(self._seen, force=force)
        self._reread = snapshot.mark != self._seen
        self._seen = snapshot.mark
        self.read_rows = snapshot.rows is not None
        if snapshot.rows is not None:
            self._entries = {}
            self.tasks = {}
            for row in snapshot.rows:
                if not row.enabled:
                    continue
                self.tasks[row.name] = row.task
                try:
                    entry = carried(row, live=True)
                except Refused as exc:
                    self._entries[row.name] = exc
                    continue
                if entry.enabled:
                    self._entries[row.name] = replace(entry, notes=())
        return dict(self._entries)


def listing_fields(db: Database, queue_table: str = "delayed_queue", *,
                   schema: str | None = None) -> dict[str, SourceFields]:
    """django-celery-beat's tasks in this database, as ``delayq beat list`` shows the entries a
    beat in admin mode installed from them (origin, the admin's enabled flag, task, schedule);
    empty when its tables are not there, or this role may not read them (then the listing
    shows what the ledger alone knows)."""
    tables = DjangoBeatTables(db, queue_table, schema=schema)
    try:
        rows = (tables.read(force=True).rows or []) if tables.present() else []
    except (SchemaMissing, PermissionDenied):
        return {}
    out: dict[str, SourceFields] = {}
    for row in rows:
        try:
            entry = carried(row, live=True)
        except Refused as exc:
            out[row.name] = SourceFields(SOURCE, row.enabled, row.task,
                                         f"refused: {exc.reason}")
            continue
        schedule = describe({"schedule": schedule_to_json(entry.schedule)})
        out[row.name] = SourceFields(SOURCE, entry.enabled, entry.task, schedule)
    return out


def record_runs(queue: DelayedQueue, delivered: Sequence[tuple[str, object]]) -> int:
    """The worker's side of admin mode: occurrences it received (their key and header) whose
    entry came from django-celery-beat's tables are written to the task's run history, each
    once (:meth:`~delayq_transport.core.integrations.DjangoBeatTables.record_runs`). A failure is
    logged and never stops the delivery: the task runs, its history is not written."""
    runs = []
    for key, header in delivered:
        if not isinstance(header, Mapping) or header.get("source") != SOURCE:
            continue
        try:
            runs.append((key, str(header["entry"]), int(header["at_ms"])))
        except (KeyError, TypeError, ValueError):
            continue
    if not runs:
        return 0
    try:
        return DjangoBeatTables(queue.db, queue.table).record_runs(runs)
    except DelayqError as exc:
        log.warning("delayq: could not write the run history of %d django-celery-beat "
                    "occurrence(s): %s", len(runs), exc)
        return 0
