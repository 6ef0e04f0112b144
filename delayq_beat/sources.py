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

import json
import shelve
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab

from delayq_transport.core.db import Database
from delayq_transport.core.djbeat import DjangoBeatTables
from delayq_transport.core.errors import InvalidInput
from delayq_transport.core.urls import mask_password
from delayq_transport.scheduling import djbeat
from delayq_transport.scheduling.carried import Carried, Refused, first_install_anchor
from delayq_transport.scheduling.entries import DELAYQ_OPTIONS, zone_name
from delayq_transport.scheduling.schedules import SCHEDULE_TYPES, Crontab, Interval, Schedule

from .entries import from_celery, own_zone

#: Options delayq beat's messages carry (besides the delayq_* entry options); an entry with
#: any other ``apply_async`` option is refused rather than sent without it.
CARRIED_OPTIONS = frozenset({"queue", "exchange", "routing_key", "priority", "expires",
                             "headers", *DELAYQ_OPTIONS})

Item = Carried | Refused


class Source(Protocol):
    kind: str
    where: str
    #: Why ``--disable-source`` cannot apply (None: it can).
    cannot_disable: str | None

    def read(self) -> list[Item]: ...

    def set_enabled(self, names: list[str], enabled: bool) -> list[str]: ...

    def close(self) -> None: ...


def celery_entry(name: str, task: object, sched: object, args: Any, kwargs: Any,
                 options: Mapping[str, Any] | None, *, enabled: bool = True,
                 last_run_at: datetime | None = None, total_run_count: int = 0,
                 zone: tzinfo | None = None, relative: bool = False) -> Item:
    """A Celery beat entry (``beat_schedule``, a schedule file's, RedBeat's) carried, or
    refused: ``zone`` is the app's for crontabs without one of their own (None: unknown)."""
    try:
        return _celery_entry(name, task, sched, args, kwargs, dict(options or {}), enabled,
                             last_run_at, total_run_count, zone, relative)
    except Refused as exc:
        return exc


def _celery_entry(name: str, task: object, sched: object, args: Any, kwargs: Any,
                  options: dict[str, Any], enabled: bool, last_run_at: datetime | None,
                  total_run_count: int, zone: tzinfo | None, relative: bool) -> Carried:
    if not isinstance(task, str) or not task:
        raise Refused(name, f"task must be a task name, got {task!r}")
    unknown = sorted(set(options) - CARRIED_OPTIONS)
    if unknown:
        raise Refused(name, f"option(s) {', '.join(unknown)} are not carried by delayq beat's "
                            "messages (it sends queue, exchange, routing_key, priority, "
                            "expires and headers)")
    if relative or getattr(sched, "relative", False):
        raise Refused(name, "relative=True (the interval is rounded to its unit from the last "
                            "run): delayq's intervals are anchored; re-add it without relative")
    engine = _engine_schedule(name, sched)
    notes: list[str] = []
    own = own_zone(sched)
    if isinstance(engine, Crontab) and "delayq_tz" not in options:
        chosen = own or zone
        if chosen is None:
            raise Refused(name, "a crontab without a time zone of its own, and the app's is "
                                "unknown: give --tz (the timezone of the app that ran it)")
        options["delayq_tz"] = zone_name(chosen)
        notes.append(f"crontab read in {zone_name(chosen)}")
    if isinstance(engine, Interval) and last_run_at is not None \
            and "delayq_anchor" not in options:
        options["delayq_anchor"] = last_run_at
        notes.append(f"every {engine.seconds:g}s counted from its last run "
                     f"({last_run_at.isoformat()})")
    elif (note := first_install_anchor(engine, options)) is not None:
        notes.append(f"every {getattr(engine, 'seconds', 0):g}s {note}")
    history = {"last_run_at": last_run_at, "total_run_count": total_run_count}
    return Carried(name, task, engine, tuple(args or ()), dict(kwargs or {}), options, enabled,
                   tuple(notes), history).validated()


def _engine_schedule(name: str, sched: object) -> Schedule:
    try:
        engine = from_celery(sched)
        if isinstance(engine, int | float | timedelta) and not isinstance(engine, bool):
            engine = Interval.of(engine)
    except InvalidInput as exc:
        raise Refused(name, str(exc)) from exc
    if not isinstance(engine, SCHEDULE_TYPES):
        raise Refused(name, f"schedule type {type(sched).__name__} cannot be carried (delayq "
                            "runs intervals, crontabs, solar events and clocked instants)")
    return engine


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
        out: list[Item] = []
        for row in self._tables.read(force=True).rows or []:
            try:
                out.append(djbeat.carried(row))
            except Refused as exc:
                out.append(exc)
        return out

    def set_enabled(self, names: list[str], enabled: bool) -> list[str]:
        return self._tables.set_enabled(names, enabled)

    def close(self) -> None:
        self._db.close()


# -- RedBeat -----------------------------------------------------------------------------------


@dataclass
class RedBeatSource:
    """RedBeat's entries in the Redis database at ``url`` under ``prefix``."""

    url: str
    prefix: str = "redbeat:"
    zone: tzinfo | None = None
    kind: str = "redbeat"
    cannot_disable: str | None = None

    def __post_init__(self) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - redbeat users have it
            raise InvalidInput("reading RedBeat needs the redis package: pip install redis") \
                from exc
        self.where = mask_password(self.url)
        self._redis = redis.Redis.from_url(self.url, decode_responses=True)

    def _keys(self) -> list[str]:
        return [str(k) for k in self._redis.zrange(f"{self.prefix}:schedule", 0, -1)]

    def read(self) -> list[Item]:
        statics = set(self._redis.smembers(f"{self.prefix}:statics"))
        out: list[Item] = []
        for key in self._keys():
            definition, meta = self._redis.hmget(key, "definition", "meta")
            name = key.removeprefix(self.prefix)
            if not definition:
                continue  # deleted between the two reads
            item = self._entry(name, str(definition), None if meta is None else str(meta))
            if isinstance(item, Carried) and item.name in statics:
                item = replace(item, notes=(*item.notes, "static entry of the app's "
                                            "beat_schedule: RedBeat rewrites it when it starts"))
            out.append(item)
        return out

    def _entry(self, name: str, definition: str, meta: str | None) -> Item:
        try:
            d = json.loads(definition, object_hook=_redbeat_value)
            m = json.loads(meta, object_hook=_redbeat_value) if meta else {}
        except Refused as exc:
            return Refused(name, exc.reason)
        except (ValueError, TypeError, KeyError) as exc:
            return Refused(name, f"RedBeat definition cannot be read: {exc}")
        sched = d.get("schedule")
        relative = isinstance(sched, _Relative)
        return celery_entry(str(d.get("name") or name), d.get("task"),
                            sched.interval if isinstance(sched, _Relative) else sched,
                            d.get("args"), d.get("kwargs"), d.get("options"),
                            enabled=bool(d.get("enabled", True)),
                            last_run_at=m.get("last_run_at"),
                            total_run_count=int(m.get("total_run_count") or 0),
                            zone=self.zone, relative=relative)

    def set_enabled(self, names: list[str], enabled: bool) -> list[str]:
        """RedBeat's own disable: the definition's ``enabled`` (its key, score and meta stay)."""
        import redis

        changed = []
        for name in names:
            key = self.prefix + name
            with self._redis.pipeline() as pipe:
                while True:
                    try:
                        pipe.watch(key)
                        raw = pipe.hget(key, "definition")
                        if not raw:
                            break
                        d = json.loads(raw)
                        if bool(d.get("enabled", True)) == enabled:
                            break
                        d["enabled"] = enabled
                        pipe.multi()
                        pipe.hset(key, "definition", json.dumps(d))
                        pipe.execute()
                        changed.append(name)
                        break
                    except redis.WatchError:
                        continue
        return changed

    def close(self) -> None:
        self._redis.close()


@dataclass(frozen=True)
class _Relative:
    interval: Interval


def _redbeat_value(d: dict[str, Any]) -> Any:
    """RedBeat's typed JSON values (``redbeat/decoder.py``) as delayq's; rrule is refused."""
    kind = d.get("__type__")
    if kind is None:
        return d
    if kind == "datetime":
        zone = d.get("timezone", "UTC")
        tz = timezone(timedelta(seconds=zone)) if isinstance(zone, int | float) \
            else ZoneInfo(str(zone))
        fields = {k: d[k] for k in ("year", "month", "day", "hour", "minute", "second",
                                    "microsecond")}
        return datetime(**fields, tzinfo=tz)
    if kind == "interval":
        interval = Interval.of(float(d["every"]))
        return _Relative(interval) if d.get("relative") else interval
    if kind == "crontab":
        return crontab(**{k: d[k] for k in ("minute", "hour", "day_of_week", "day_of_month",
                                            "month_of_year") if k in d})
    raise Refused("", f"RedBeat schedule type {kind!r} cannot be carried (delayq runs "
                      "intervals, crontabs, solar events and clocked instants)")


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
