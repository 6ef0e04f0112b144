"""When a schedule fires: UTC instants, computed the same way in every process.

Pure (no database, no framework), so every scheduler computes the same keys
``{entry}/{configHash}/{UTC epoch ms}`` for the same configuration, and the unique index on the
key makes the first insert win. Rules (documented in docs/how-to/beat.md):

* interval entries fire on multiples of the period since their anchor: the Unix epoch unless
  anchored (a start time, or the entry's first install as the ledger recorded it), so
  independent processes agree without sharing a start time;
* a clocked entry fires once, at its instant;
* crontab entries are evaluated on the wall clock of their time zone. A wall time that does
  not exist (spring forward) fires at the matching instant after the gap (02:30 -> 03:30); an
  ambiguous wall time (fall back) fires once, at its first instant, unless the hour field is
  ``*``, in which case it fires at both instants so an hourly job keeps running every real hour;
* solar entries follow :mod:`ephem` as ``celery.schedules.solar`` does.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any

from ..core import InvalidInput
from ..core.queue import from_ms, to_ms
from .schedules import Clocked, Crontab, Interval, Schedule, Solar, Window

#: A crontab that matches nothing within this many days is treated as invalid.
MAX_SEARCH_DAYS = 366 * 8
#: More than any DST shift: how far a wall time can move from its neighbours' instants.
_DST_SLACK = timedelta(hours=3)
_MINUTES = [timedelta(minutes=m) for m in range(60)]
#: The first window searched back from the end of a gap; each next one is 8 times longer.
_FIRST_WINDOW = timedelta(minutes=5)


Timed = Schedule | Window


def occurrences(
    sched: Timed, after: datetime, until: datetime, zone: tzinfo, min_count: int = 3
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


def next_after(sched: Timed, zone: tzinfo, at: datetime) -> datetime | None:
    """The first instant after ``at``, or None if there is none."""
    return next(iter(occurrences(sched, at, at, zone, 1)), None)


def newer_occurrence_passed(sched: Timed, zone: tzinfo, at_ms: int, now_ms: int) -> bool:
    """Whether the schedule's next occurrence after ``at_ms`` is at or before ``now_ms``."""
    following = next_after(sched, zone, from_ms(at_ms))
    return following is not None and to_ms(following) <= now_ms


def newest_occurrences(sched: Timed, zone: tzinfo, after: datetime, until: datetime,
                       limit: int) -> list[datetime]:
    """The newest ``limit`` occurrences in ``(after, until]``, oldest first.

    Searched backwards from ``until`` in growing windows: a gap can be months of a one-second
    interval, and only its end is wanted."""
    span = _FIRST_WINDOW
    while limit > 0 and after < until:
        low = max(after, until - span)
        found = occurrences(sched, low, until, zone, 0)
        if len(found) >= limit or low <= after:
            return found[-limit:]
        span *= 8
    return []


def _iterate(sched: Timed, after: datetime, zone: tzinfo) -> Iterator[datetime]:
    if isinstance(sched, Window):
        return window_times(sched, after, zone)
    if isinstance(sched, Crontab):
        return crontab_times(sched, after, zone)
    if isinstance(sched, Solar):
        return solar_times(sched, after)
    if isinstance(sched, Interval):
        if sched.from_first_install:
            raise InvalidInput("an interval anchored at its first install has no times until "
                               "the ledger resolves its anchor")
        return interval_times(timedelta(seconds=sched.seconds), after, sched.anchor_ms or 0)
    if isinstance(sched, Clocked):
        return iter([from_ms(sched.at_ms)] if sched.at_ms > to_ms(after) else [])
    raise InvalidInput(f"unsupported schedule type {type(sched).__name__}")


def interval_times(period: timedelta, after: datetime, anchor_ms: int = 0
                   ) -> Iterator[datetime]:
    """``anchor + k * period`` after ``after`` (the epoch is anchor 0)."""
    period_ms = int(period.total_seconds() * 1000)
    ms = anchor_ms + ((to_ms(after) - anchor_ms) // period_ms + 1) * period_ms
    while True:
        yield from_ms(ms)
        ms += period_ms


def window_times(window: Window, after: datetime, zone: tzinfo) -> Iterator[datetime]:
    """The schedule's instants from ``start_ms`` (inclusive) to ``end_ms`` (exclusive); with
    ``once`` only the first one from ``start_ms``, whatever ``after`` is."""
    start = None if window.start_ms is None else from_ms(window.start_ms - 1)
    times: Iterator[datetime]
    if window.once:
        first = next(_iterate(window.schedule, start or after, zone), None)
        times = iter([] if first is None else [first])
    else:
        times = _iterate(window.schedule, after if start is None else max(after, start), zone)
    for at in times:
        if window.end_ms is not None and to_ms(at) >= window.end_ms:
            return
        if at > after:
            yield at


def crontab_times(cron: Crontab, after: datetime, zone: tzinfo) -> Iterator[datetime]:
    """Month, day of month AND day of week must all match (Celery's crontab semantics).

    Wall hours are converted one at a time and released through a heap once no later wall
    hour can map before them (a DST gap moves 02:30 after 03:00), so output is sorted.
    """
    every_hour = cron.every_hour
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
    raise InvalidInput(f"crontab {_text(cron)!r} has no occurrence within {MAX_SEARCH_DAYS} "
                       "days")


def _text(cron: Crontab) -> str:
    return " ".join(cron.written)


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


def _day_matches(cron: Crontab, day: date) -> bool:
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


# -- solar (celery.schedules.solar's computation) -------------------------------------------

_HORIZONS = {"dawn_astronomical": "-18", "dawn_nautical": "-12", "dawn_civil": "-6",
             "sunrise": "-0:34", "solar_noon": "0", "sunset": "-0:34", "dusk_civil": "-6",
             "dusk_nautical": "-12", "dusk_astronomical": "-18"}
_RISING = ("dawn_astronomical", "dawn_nautical", "dawn_civil", "sunrise")
_CENTER = ("dawn_astronomical", "dawn_nautical", "dawn_civil", "dusk_civil", "dusk_nautical",
           "dusk_astronomical")
#: Days Celery searches ahead for an event that does not happen every day (polar days).
_SOLAR_SEARCH_DAYS = 366


def _next_event(sun: Solar, ephem: Any, start: Any) -> Any:
    """The first event after ``start``; past a polar day or night, the search goes on from the
    next anti-transit, and stops (returning where it stopped) after a year, as Celery's."""
    cal = ephem.Observer()
    cal.lat, cal.lon, cal.elev = str(sun.lat), str(sun.lon), 0
    cal.horizon, cal.pressure = _HORIZONS[sun.event], 0
    method = ("next_rising" if sun.event in _RISING else
              "next_transit" if sun.event == "solar_noon" else "next_setting")
    kwargs = {"use_center": True} if sun.event in _CENTER else {}
    body = ephem.Sun()
    for _ in range(_SOLAR_SEARCH_DAYS):
        try:
            return getattr(cal, method)(body, start=start, **kwargs)
        except ephem.CircumpolarError:
            start = cal.next_antitransit(body, start=start)
    return start


def solar_times(sun: Solar, after: datetime) -> Iterator[datetime]:
    import ephem

    start = after
    for _ in range(MAX_SEARCH_DAYS):
        event = _next_event(sun, ephem, ephem.Date(start.astimezone(UTC).replace(tzinfo=None)))
        at = event.datetime().replace(tzinfo=UTC)
        # ms resolution: keys are in ms, and the next search must start strictly after.
        at = from_ms(math.ceil(at.timestamp() * 1000))
        if at > after:
            yield at
            after = at
        start = at + timedelta(seconds=1)
    raise InvalidInput(f"solar {sun.event} at {sun.lat},{sun.lon} has no occurrence within "
                       f"{MAX_SEARCH_DAYS} days")
