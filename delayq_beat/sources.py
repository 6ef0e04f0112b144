"""Where ``delayq beat import`` reads entries from: django-celery-beat's tables, RedBeat's Redis
keys, Celery's ``celerybeat-schedule`` file, or an app's ``beat_schedule``.

Each :class:`Source` returns every entry it holds as a
:class:`~delayq_transport.scheduling.carried.Carried` entry or a
:class:`~delayq_transport.scheduling.carried.Refused` one, and says whether (and how) it can
disable its entries once imported.

* django-celery-beat: its tables through the core's named statements (no Django project
  needed); disabling sets ``enabled = false`` and bumps ``PeriodicTasks.last_update``, as the
  admin's bulk action does.
* RedBeat (``redbeat/schedulers.py``): every key of the ``<prefix>:schedule`` sorted set is a
  hash with ``definition`` (JSON: name, task, args, kwargs, options, schedule, enabled; typed
  values as ``{"__type__": "datetime" | "interval" | "crontab" | "rrule", ...}``, see
  ``redbeat/decoder.py``) and ``meta`` (``last_run_at``, ``total_run_count``). Disabling sets
  the definition's ``enabled`` to false, as ``entry.enabled = False; entry.save()`` does.
* ``celerybeat-schedule``: the shelve of Celery's ``PersistentScheduler`` (``entries``: name ->
  ``ScheduleEntry`` with ``last_run_at`` and ``total_run_count``; ``tz``: the app's zone).
* an app (``proj.celery:app``): its ``beat_schedule`` as Celery's beat reads it.

A file's or an app's entries are configuration: delayq cannot disable them (remove them from
``beat_schedule`` and stop the old beat instead).
"""

from __future__ import annotations

import shelve
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from delayq_transport.core import InvalidInput
from delayq_transport.core.db import Database, mask_password
from delayq_transport.core.integrations import DjangoBeatTables
from delayq_transport.core.integrations import DjangoBeatTask as TaskRow
from delayq_transport.scheduling import djbeat
from delayq_transport.scheduling.carried import Refused

from .carry import Item, Source, celery_entry
from .source_redbeat import RedBeatSource

__all__ = ["AppSource", "DjangoBeatSource", "Item", "RedBeatSource", "ScheduleFileSource",
           "RowsSource", "Source", "carry_rows", "celery_entry", "open_source"]


# -- django-celery-beat ------------------------------------------------------------------------


@dataclass
class DjangoBeatSource:
    """django-celery-beat's tables in the database at ``url`` (``schema``: where they are)."""

    url: str
    schema: str | None = None
    kind: str = djbeat.SOURCE
    cannot_disable: str | None = None

    def __post_init__(self) -> None:
        self._db = Database(self.url, min_size=0, max_size=1)
        self.where = mask_password(self._db.url)
        self._tables = DjangoBeatTables(self._db, schema=self.schema)

    def read(self) -> list[Item]:
        return carry_rows(self._tables.read(force=True).rows or [])

    def set_enabled(self, names: list[str], enabled: bool) -> list[str]:
        return self._tables.set_enabled(names, enabled)

    def close(self) -> None:
        self._db.close()


def carry_rows(rows: Iterable[TaskRow]) -> list[Item]:
    """django-celery-beat's tasks as an import reads them: each carried, or refused."""
    out: list[Item] = []
    for row in rows:
        try:
            out.append(djbeat.carried(row))
        except Refused as exc:
            out.append(exc)
    return out


@dataclass
class RowsSource:
    """django-celery-beat's tasks already read (by a beat watching its change mark), as a
    :class:`Source` that :func:`~.imports.plan` can compare with what an import stored."""

    rows: list[TaskRow]
    where: str = "the beat's database"
    kind: str = djbeat.SOURCE
    cannot_disable: str | None = "a beat's read of the tables disables nothing"

    def read(self) -> list[Item]:
        return carry_rows(self.rows)

    def set_enabled(self, names: list[str], enabled: bool) -> list[str]:
        raise InvalidInput(str(self.cannot_disable))

    def close(self) -> None:
        pass


# -- Celery's schedule file and an app's beat_schedule -----------------------------------------

_CONFIG = ("a {what}'s entries are configuration delayq cannot disable: remove them from "
           "beat_schedule and stop the old beat")


@dataclass
class ScheduleFileSource:
    """Celery's ``PersistentScheduler`` file (``celerybeat-schedule``), read only."""

    path: str
    zone: tzinfo | None = None
    kind: str = "schedule-file"
    cannot_disable: str | None = _CONFIG.format(what="schedule file")

    def __post_init__(self) -> None:
        self.where = self.path

    def read(self) -> list[Item]:
        with _open_shelve(self.path) as db:
            entries = dict(db.get("entries") or {})
            # The app's timezone when beat last ran; none set and enable_utc: UTC.
            stored_tz = db.get("tz") or ("UTC" if db.get("utc_enabled", True) else None)
        zone = self.zone or (_zone(str(stored_tz)) if stored_tz else None)
        out: list[Item] = []
        for name, entry in sorted(entries.items()):
            out.append(celery_entry(
                name, entry.task, entry.schedule, entry.args, entry.kwargs, entry.options,
                last_run_at=_aware(entry.last_run_at),
                total_run_count=int(entry.total_run_count or 0), zone=zone))
        return out

    def set_enabled(self, names: list[str], enabled: bool) -> list[str]:
        raise InvalidInput(str(self.cannot_disable))

    def close(self) -> None:
        pass


@dataclass
class AppSource:
    """The ``beat_schedule`` of an importable Celery app (``proj.celery:app`` or ``proj``)."""

    ref: str
    zone: tzinfo | None = None
    kind: str = "app"
    cannot_disable: str | None = _CONFIG.format(what="Celery app")

    def __post_init__(self) -> None:
        self.where = self.ref

    def read(self) -> list[Item]:
        from celery.app.utils import find_app

        try:
            app = find_app(self.ref)
        except Exception as exc:  # any import error of the user's module
            raise InvalidInput(f"cannot import the Celery app {self.ref!r}: {exc}") from exc
        zone = self.zone or app.timezone
        out: list[Item] = []
        for name, raw in sorted((app.conf.beat_schedule or {}).items()):
            raw = dict(raw)
            out.append(celery_entry(
                name, raw.get("task"), raw.get("schedule"), raw.get("args"),
                raw.get("kwargs"), raw.get("options"), zone=zone,
                relative=bool(raw.get("relative"))))
        return out

    def set_enabled(self, names: list[str], enabled: bool) -> list[str]:
        raise InvalidInput(str(self.cannot_disable))

    def close(self) -> None:
        pass


def _open_shelve(path: str) -> shelve.Shelf[Any]:
    """The file as given, or without the suffix a dbm module adds (``.db``, ``.dat``)."""
    candidates = [path] + [path.removesuffix(s) for s in (".db", ".dat", ".dir", ".bak")
                           if path.endswith(s)]
    for candidate in candidates:
        try:
            return shelve.open(candidate, flag="r")
        except Exception:  # dbm.error of whichever module: try the next name
            continue
    raise InvalidInput(f"cannot open {path!r} as Celery's schedule file (a shelve written by "
                       "celery beat's PersistentScheduler)")


def _aware(value: object) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _zone(name: str) -> tzinfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"unknown time zone {name!r}") from exc


def open_source(kind: str, location: str | None, *, database_url: str | None,
                zone: str | None = None, schema: str | None = None,
                redbeat_prefix: str = "redbeat:") -> Source:
    """``--from KIND [LOCATION]``: django-celery-beat (LOCATION: its database, default delayq's),
    redbeat (LOCATION: its Redis URL), else KIND is a schedule file (an existing path) or an
    app reference."""
    tz = _zone(zone) if zone else None
    if kind == djbeat.SOURCE:
        url = location or database_url
        if not url:
            raise InvalidInput("--from django-celery-beat needs the database holding its tables")
        return DjangoBeatSource(url, schema)
    if kind == "redbeat":
        if not location:
            raise InvalidInput("--from redbeat needs RedBeat's Redis URL (redbeat_redis_url)")
        return RedBeatSource(location, redbeat_prefix, tz)
    if location:
        raise InvalidInput(f"--from {kind!r} takes no location (only django-celery-beat and "
                           "redbeat do)")
    if Path(kind).exists() or any(Path(kind + s).exists() for s in (".db", ".dat")):
        return ScheduleFileSource(kind, tz)
    if ":" in kind or "." in kind or kind.isidentifier():
        return AppSource(kind, tz)
    raise InvalidInput(f"--from {kind!r}: not django-celery-beat, redbeat, a schedule file or "
                       "an app (module:attribute)")
