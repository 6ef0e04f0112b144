"""Beat entries as delayq sees them: validated specs, config hashes and occurrence instants.

Everything here is pure (no database, no broker), so every beat process computes the same keys
``{entry}/{configHash}/{UTC epoch ms}`` for the same configuration; the unique index on the
key then makes the first insert win. Occurrences are UTC instants, whatever the time zone.

Time rules (documented in docs/how-to/beat.md):

* interval entries (``timedelta``/``schedule``) fire on multiples of the period since the Unix
  epoch, so independent processes agree without sharing a start time;
* crontab entries are evaluated on the wall clock of the app's time zone. A wall time that does
  not exist (spring forward) fires at the matching instant after the gap (02:30 -> 03:30); an
  ambiguous wall time (fall back) fires once, at its first instant, unless the hour field is
  ``*``, in which case it fires at both instants so an hourly job keeps running every real hour;
* solar entries follow :mod:`ephem`, as Celery does.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any
from urllib.parse import unquote

from celery.schedules import BaseSchedule, crontab, schedule, solar

from delayq_transport.core.cron import config_hash, validate_prefix
from delayq_transport.core.errors import InvalidInput
from delayq_transport.core.timeutil import from_ms, to_ms

MISFIRE_POLICIES = ("coalesce", "run_all", "skip")
DEFAULT_MISFIRE = "coalesce"
DEFAULT_GRACE_S = 60.0
#: Options that steer delayq and are not passed on to the task message.
DELAYQ_OPTIONS = ("delayq_misfire", "delayq_grace")
#: A crontab that matches nothing within this many days is treated as invalid.
MAX_SEARCH_DAYS = 366 * 8
_HASH_VERSION = "delayq-beat-1"
#: More than any DST shift: how far a wall time can move from its neighbours' instants.
_DST_SLACK = timedelta(hours=3)
_MINUTES = [timedelta(minutes=m) for m in range(60)]


def key_prefix(name: object) -> str:
    """The key prefix of an entry name: ``%`` and ``/`` percent-encoded, the rest as is.

    ``/`` separates the key's parts, so it cannot appear raw; encoding ``%`` too keeps the
    mapping reversible. ``_`` and ``%`` stay literal in SQL because cron.py escapes LIKE.
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput(f"beat entry name must be a non-empty str, got {name!r}")
    if any(ord(c) < 32 for c in name):
        raise InvalidInput(f"beat entry name must not contain control characters: {name!r}")
    return validate_prefix(name.replace("%", "%25").replace("/", "%2F"))


def entry_name(prefix: str) -> str:
    return unquote(prefix)


@dataclass(frozen=True)
class EntrySpec:
    """One validated entry: what to send, when, and how to treat misfires."""

    name: str
    task: str
    schedule: BaseSchedule
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    misfire: str = DEFAULT_MISFIRE
    grace_s: float = DEFAULT_GRACE_S
    source: str = "config"

    @property
    def prefix(self) -> str:
        return key_prefix(self.name)


def make_spec(
    name: str,
    task: object,
    sched: object,
    args: Any = (),
    kwargs: Any = None,
    options: Any = None,
    *,
    default_misfire: str = DEFAULT_MISFIRE,
    default_grace_s: float = DEFAULT_GRACE_S,
    source: str = "config",
) -> EntrySpec:
    """Validate one entry; raises InvalidInput naming the entry and the problem."""
    key_prefix(name)
    if not isinstance(task, str) or not task:
        raise InvalidInput(f"beat entry {name!r}: task must be a task name, got {task!r}")
    args = tuple(args or ())
    kwargs = dict(kwargs or {})
    options = dict(options or {})
    for what, value in (("args", list(args)), ("kwargs", kwargs)):
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(
                f"beat entry {name!r}: {what} must be JSON-serialisable (occurrences are "
                f"stored ahead of time, so lazy values such as BeatLazyFunc cannot be used): {exc}"
            ) from exc
    misfire = options.pop("delayq_misfire", default_misfire)
    if misfire not in MISFIRE_POLICIES:
        raise InvalidInput(
            f"beat entry {name!r}: delayq_misfire must be one of {MISFIRE_POLICIES}, "
            f"got {misfire!r}"
        )
    grace = _seconds(options.pop("delayq_grace", default_grace_s),
                     f"beat entry {name!r}: delayq_grace")
    return EntrySpec(name, task, coerce_schedule(name, sched), args, kwargs, options,
                     misfire, grace, source)


def _seconds(value: object, what: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidInput(f"{what} must be a non-negative number of seconds, got {value!r}")
    return float(value)


def coerce_schedule(name: str, sched: object) -> BaseSchedule:
    """Numbers and timedeltas become ``schedule``; unsupported types are refused by name."""
    if isinstance(sched, bool) or sched is None:
        raise InvalidInput(f"beat entry {name!r}: schedule is missing or invalid: {sched!r}")
    if isinstance(sched, int | float | timedelta):
        sched = schedule(timedelta(seconds=sched) if not isinstance(sched, timedelta) else sched)
    if isinstance(sched, schedule):
        if sched.run_every.total_seconds() < 1:
            raise InvalidInput(f"beat entry {name!r}: interval must be at least 1 second")
        return sched
    if isinstance(sched, crontab | solar):
        return sched
    raise InvalidInput(
        f"beat entry {name!r}: unsupported schedule type {type(sched).__name__} "
        "(use a number, timedelta, celery.schedules.schedule, crontab or solar)"
    )


# -- config hash -------------------------------------------------------------------------


def schedule_fingerprint(sched: BaseSchedule) -> tuple[Any, ...]:
    """A canonical description: crontab by its expanded fields, so '*/15' == '0,15,30,45'."""
    if isinstance(sched, crontab):
        return ("crontab", *(tuple(sorted(getattr(sched, f))) for f in
                             ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")))
    if isinstance(sched, solar):
        return ("solar", sched.event, float(sched.lat), float(sched.lon))
    if isinstance(sched, schedule):
        return ("every", sched.run_every.total_seconds())
    raise InvalidInput(f"unsupported schedule type {type(sched).__name__}")


def entry_hash(spec: EntrySpec, zone: tzinfo) -> str:
    """Covers everything that shapes an occurrence: task, schedule, args, options, time zone."""
    canonical = json.dumps(
        {"args": list(spec.args), "kwargs": spec.kwargs, "options": spec.options,
         "misfire": [spec.misfire, spec.grace_s]},
        sort_keys=True, default=repr,
    )
    return config_hash(_HASH_VERSION, spec.task, schedule_fingerprint(spec.schedule), canonical,
                       zone_name(zone))


def zone_name(zone: tzinfo) -> str:
    return str(getattr(zone, "key", None) or zone)


# -- occurrences -------------------------------------------------------------------------


def occurrences(
    sched: BaseSchedule, after: datetime, until: datetime, zone: tzinfo, min_count: int = 3
) -> list[datetime]:
    """Instants in ``(after, until]``, extended to at least ``min_count`` of them (UTC)."""
    to_ms(after, what="after")
    to_ms(until, what="until")
    result: list[datetime] = []
    for at in _iterate(sched, after, zone):
        if at > until and len(result) >= min_count:
            break
        result.append(at)
    return result


def _iterate(sched: BaseSchedule, after: datetime, zone: tzinfo) -> Iterator[datetime]:
    if isinstance(sched, crontab):
        return crontab_times(sched, after, zone)
    if isinstance(sched, solar):
        return solar_times(sched, after)
    if isinstance(sched, schedule):
        return interval_times(sched.run_every, after)
    raise InvalidInput(f"unsupported schedule type {type(sched).__name__}")


def interval_times(period: timedelta, after: datetime) -> Iterator[datetime]:
    period_ms = int(period.total_seconds() * 1000)
    ms = (to_ms(after) // period_ms + 1) * period_ms
    while True:
        yield from_ms(ms)
        ms += period_ms


def crontab_times(cron: crontab, after: datetime, zone: tzinfo) -> Iterator[datetime]:
    """Celery's crontab semantics (month, day of month AND day of week must all match).

    Wall hours are converted one at a time and released through a heap once no later wall
    hour can map before them (a DST gap moves 02:30 after 03:00), so output is sorted.
    """
    every_hour = set(cron.hour) == set(range(24))
    minutes, hours = sorted(cron.minute), sorted(cron.hour)
    earliest_wall = after.astimezone(zone).replace(tzinfo=None) - _DST_SLACK
    day = earliest_wall.date()
    pending: list[datetime] = []
    for _ in range(MAX_SEARCH_DAYS):
        if _day_matches(cron, day):
            for h in hours:
                wall = datetime(day.year, day.month, day.day, h)
                if wall + timedelta(hours=1) < earliest_wall:
                    continue
                for at in _hour_instants(wall, minutes, zone, every_hour):
                    if at > after:
                        heapq.heappush(pending, at)
                bound = (wall + timedelta(hours=1) - _DST_SLACK).replace(tzinfo=zone)
                while pending and pending[0] < bound:
                    at = heapq.heappop(pending)
                    if at > after:
                        yield at
                        after = at  # a DST gap can map two wall times to one instant
        day += timedelta(days=1)
    while pending:
        at = heapq.heappop(pending)
        if at > after:
            yield at
            after = at
    raise InvalidInput(f"crontab {cron!r} has no occurrence within {MAX_SEARCH_DAYS} days")


def _hour_instants(
    wall: datetime, minutes: list[int], zone: tzinfo, both_folds: bool
) -> list[datetime]:
    """One hour's instants; plain offset arithmetic unless a transition falls in this hour."""
    edges = [wall.replace(minute=m, tzinfo=zone, fold=f).utcoffset()
             for m in (0, 59) for f in (0, 1)]
    if len(set(edges)) == 1 and edges[0] is not None:
        start = (wall - edges[0]).replace(tzinfo=UTC)
        return [start + _MINUTES[m] for m in minutes]
    return [at for m in minutes
            for at in wall_instants(wall.date(), wall.hour, m, zone, both_folds=both_folds)]


def _day_matches(cron: crontab, day: date) -> bool:
    return (day.month in cron.month_of_year and day.day in cron.day_of_month
            and day.isoweekday() % 7 in cron.day_of_week)


def wall_instants(
    day: date, hour: int, minute: int, zone: tzinfo, *, both_folds: bool
) -> list[datetime]:
    """UTC instants of a wall time: a gap maps past the gap, a repeated time to 1 or 2 instants."""
    wall = datetime(day.year, day.month, day.day, hour, minute)
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second or not both_folds:
        return [first]
    repeated = first.astimezone(zone).replace(tzinfo=None) == wall  # not a gap: a real repeat
    return [min(first, second), max(first, second)] if repeated else [first]


def solar_times(sun: solar, after: datetime) -> Iterator[datetime]:
    ephem = sun.ephem
    start = after
    for _ in range(MAX_SEARCH_DAYS):
        event = sun._next_event(ephem.Date(start.astimezone(UTC).replace(tzinfo=None)))
        at = event.datetime().replace(tzinfo=UTC)
        # ms resolution: keys are in ms, and the next search must start strictly after.
        at = from_ms(math.ceil(at.timestamp() * 1000))
        if at > after:
            yield at
            after = at
        start = at + timedelta(seconds=1)
    raise InvalidInput(f"{sun!r} has no occurrence within {MAX_SEARCH_DAYS} days")


# -- DB-backed definitions ---------------------------------------------------------------


def schedule_to_json(sched: BaseSchedule) -> dict[str, Any]:
    if isinstance(sched, crontab):
        return {"type": "crontab", "minute": sched._orig_minute, "hour": sched._orig_hour,
                "day_of_week": sched._orig_day_of_week,
                "day_of_month": sched._orig_day_of_month,
                "month_of_year": sched._orig_month_of_year}
    if isinstance(sched, solar):
        return {"type": "solar", "event": sched.event, "lat": sched.lat, "lon": sched.lon}
    if isinstance(sched, schedule):
        return {"type": "every", "seconds": sched.run_every.total_seconds()}
    raise InvalidInput(f"unsupported schedule type {type(sched).__name__}")


def schedule_from_json(data: Mapping[str, Any]) -> BaseSchedule:
    """Rebuild a schedule; a bad crontab field raises InvalidInput with Celery's reason."""
    kind = data.get("type")
    try:
        if kind == "crontab":
            fields = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
            return crontab(**{f: str(data.get(f, "*")) for f in fields})
        if kind == "solar":
            return solar(data["event"], float(data["lat"]), float(data["lon"]))
        if kind == "every":
            return schedule(timedelta(seconds=float(data["seconds"])))
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"invalid {kind} schedule {dict(data)!r}: {exc}") from exc
    except Exception as exc:  # celery's ParseException / ImproperlyConfigured (no ephem)
        raise InvalidInput(f"invalid {kind} schedule {dict(data)!r}: {exc}") from exc
    raise InvalidInput(f"unknown schedule type {kind!r} (expected crontab, every or solar)")


def parse_crontab(text: str) -> BaseSchedule:
    """``"m h dom mon dow"`` (the crontab(5) order) -> a Celery crontab, or InvalidInput."""
    parts = text.split()
    if len(parts) != 5:
        raise InvalidInput(f"crontab {text!r} must have 5 fields: minute hour day month weekday")
    minute, hour, dom, month, dow = parts
    return schedule_from_json({"type": "crontab", "minute": minute, "hour": hour,
                               "day_of_month": dom, "month_of_year": month, "day_of_week": dow})
