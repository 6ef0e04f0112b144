"""Schedules as the engine sees them: :class:`Interval`, :class:`Crontab`, :class:`Solar` and
:class:`Clocked` (one instant), and the :class:`Window` an entry's bounds make of them.

Framework-neutral values. Celery beat's adapter translates ``celery.schedules`` objects into
them, Dramatiq's ``@periodic`` its ``cron=``/``every=`` arguments, and DB-backed entries are
stored as their JSON (:func:`schedule_to_json`). A crontab keeps both its expanded fields (what
it means, and what the config hash covers: ``*/15`` and ``0,15,30,45`` are the same entry) and
the fields as written (what ``delayq beat list`` shows and the database stores).

Crontab fields follow Celery's ``crontab`` (``celery.schedules.crontab_parser``): ``*``,
numbers, ranges (wrapping past the end: ``fri-mon``), steps, comma lists, and English day and
month names; day of week 0-6 from Sunday; month, day of month AND day of week must all match.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..core import InvalidInput
from ..core.queue import from_ms

#: A crontab's fields in the order of their JSON and fingerprint, with (count, first value).
CRON_FIELDS: dict[str, tuple[int, int]] = {
    "minute": (60, 0), "hour": (24, 0), "day_of_week": (7, 0), "day_of_month": (31, 1),
    "month_of_year": (12, 1),
}
_WEEKDAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
SOLAR_EVENTS = ("dawn_astronomical", "dawn_nautical", "dawn_civil", "sunrise", "solar_noon",
                "sunset", "dusk_civil", "dusk_nautical", "dusk_astronomical")


@dataclass(frozen=True)
class Interval:
    """Every ``seconds`` (at least one), on multiples of the period since an anchor.

    The anchor is the Unix epoch by default (every process agrees without sharing anything:
    "every 7 days" fires on Thursdays 00:00 UTC), ``anchor_ms`` (e.g. the entry's start time),
    or, with ``from_first_install``, the time the entry was first installed, which the ledger
    records once for every scheduler (:meth:`~.store.EntryStore.first_install`)."""

    seconds: float
    anchor_ms: int | None = None
    from_first_install: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int | float) \
                or self.seconds < 1:
            raise InvalidInput(f"interval must be at least 1 second, got {self.seconds!r}")
        object.__setattr__(self, "seconds", float(self.seconds))  # 10 and 10.0: one hash
        if self.anchor_ms is not None and self.from_first_install:
            raise InvalidInput("an interval is anchored at a time or at its first install, "
                               "not both")

    @classmethod
    def of(cls, period: timedelta | float, anchor_ms: int | None = None,
           from_first_install: bool = False) -> Interval:
        """From seconds or a timedelta, rounded to microseconds as a timedelta is (so a
        number and the timedelta made of it are one entry)."""
        if not isinstance(period, timedelta):
            period = timedelta(seconds=period)
        return cls(period.total_seconds(), anchor_ms, from_first_install)


@dataclass(frozen=True)
class Crontab:
    """Expanded fields (sets of values) plus the fields as written."""

    minute: frozenset[int]
    hour: frozenset[int]
    day_of_week: frozenset[int]
    day_of_month: frozenset[int]
    month_of_year: frozenset[int]
    #: The fields as written, in :data:`CRON_FIELDS` order.
    written: tuple[str, ...] = ("*",) * 5

    @classmethod
    def of(cls, minute: object = "*", hour: object = "*", day_of_week: object = "*",
           day_of_month: object = "*", month_of_year: object = "*") -> Crontab:
        """Celery's ``crontab(...)`` arguments: each a str, an int or an iterable of ints."""
        given = {"minute": minute, "hour": hour, "day_of_week": day_of_week,
                 "day_of_month": day_of_month, "month_of_year": month_of_year}
        expanded = {name: expand_field(value, *CRON_FIELDS[name])
                    for name, value in given.items()}
        written = tuple(_written(given[name]) for name in CRON_FIELDS)
        return cls(**expanded, written=written)

    @property
    def every_hour(self) -> bool:
        return self.hour == frozenset(range(24))


@dataclass(frozen=True)
class Solar:
    """A solar event at a place, as ``celery.schedules.solar`` computes it (needs ephem)."""

    event: str
    lat: float
    lon: float

    def __post_init__(self) -> None:
        if self.event not in SOLAR_EVENTS:
            raise InvalidInput(f"solar event must be one of {', '.join(SOLAR_EVENTS)}, "
                               f"got {self.event!r}")
        if not -90 <= self.lat <= 90 or not -180 <= self.lon <= 180:
            raise InvalidInput(f"solar latitude/longitude out of range: {self.lat}, {self.lon}")
        if importlib.util.find_spec("ephem") is None:
            raise InvalidInput("solar schedules need ephem: pip install 'delayq[solar]'")


@dataclass(frozen=True)
class Clocked:
    """One instant (django-celery-beat's ``ClockedSchedule``): installed once, run once."""

    at_ms: int


Schedule = Interval | Crontab | Solar | Clocked
SCHEDULE_TYPES = (Interval, Crontab, Solar, Clocked)


@dataclass(frozen=True)
class Window:
    """A schedule within an entry's bounds, resolved for one refresh: no occurrence before
    ``start_ms`` or at/after ``end_ms``; with ``once``, only the first at/after ``start_ms``.
    Never stored or hashed: the entry's fields are (:func:`~.entries.entry_hash`)."""

    schedule: Schedule
    start_ms: int | None = None
    end_ms: int | None = None
    once: bool = False


# -- crontab fields (Celery's crontab_parser) ---------------------------------------------


def expand_field(value: object, count: int, first: int) -> frozenset[int]:
    """One crontab field as the set of values it matches; InvalidInput naming the problem."""
    if isinstance(value, bool):
        raise InvalidInput(f"crontab field must be a str, an int or ints, got {value!r}")
    if isinstance(value, int):
        result = {value}
    elif isinstance(value, str):
        result = _parse_field(value, count, first)
    elif isinstance(value, Iterable):
        result = set(value)
    else:
        raise InvalidInput(f"crontab field must be a str, an int or ints, got {value!r}")
    bad = [v for v in result if not isinstance(v, int) or not first <= v < first + count]
    if bad:
        raise InvalidInput(f"Invalid crontab pattern. Valid range is {first}-"
                           f"{first + count - 1}. {bad[0]!r} was found.")
    return frozenset(result)


_RANGE_STEPS = re.compile(r"(\w+?)-(\w+)/(\w+)?")
_RANGE = re.compile(r"(\w+?)-(\w+)")
_STAR_STEPS = re.compile(r"\*/(\w+)?")


def _parse_field(spec: str, count: int, first: int) -> set[int]:
    result: set[int] = set()
    for part in spec.split(","):
        if not part:
            raise InvalidInput(f"crontab field {spec!r} has an empty part")
        result |= set(_parse_part(part, count, first))
    return result


def _parse_part(part: str, count: int, first: int) -> list[int]:
    """Celery's order of patterns: range/step, range, */step, *, else a single value."""
    if m := _RANGE_STEPS.match(part):
        return _expand_range(m.group(1), m.group(2), count, first)[::_step(m.group(3), part)]
    if m := _RANGE.match(part):
        return _expand_range(m.group(1), m.group(2), count, first)
    if m := _STAR_STEPS.match(part):
        return list(range(first, first + count))[::_step(m.group(1), part)]
    if re.match(r"^\*$", part):
        return list(range(first, first + count))
    return [_number(part, count, first)]


def _step(text: str | None, part: str) -> int:
    if not text:
        raise InvalidInput(f"crontab part {part!r} has an empty step")
    try:
        step = int(text)
    except ValueError as exc:
        raise InvalidInput(f"crontab part {part!r}: step {text!r} is not a number") from exc
    if step <= 0:
        raise InvalidInput(f"crontab part {part!r}: step must be positive")
    return step


def _expand_range(low: str, high: str, count: int, first: int) -> list[int]:
    start, end = _number(low, count, first), _number(high, count, first)
    if end < start:  # wraps past the end, as Celery's does: fri-mon
        return list(range(start, first + count)) + list(range(first, end + 1))
    return list(range(start, end + 1))


def _number(text: str, count: int, first: int) -> int:
    if text.startswith("-"):
        raise InvalidInput(f"crontab value {text!r}: negative numbers are not supported")
    try:
        value = int(text)
    except ValueError:
        abbreviation = text[:3].lower()
        value = _MONTHS.get(abbreviation, _WEEKDAYS.get(abbreviation, -1))
        if value < 0:
            raise InvalidInput(f"Invalid weekday literal {text!r}.") from None
    if value > first + count - 1:  # Celery's wording, as users know it
        raise InvalidInput(f"Invalid end range: {value} > {first + count - 1}.")
    if value < first:
        raise InvalidInput(f"Invalid beginning range: {value} < {first}.")
    return value


def _written(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return ",".join(str(v) for v in sorted(value))  # type: ignore[call-overload]


def parse_crontab(text: str) -> Crontab:
    """``"m h dom mon dow"`` (the crontab(5) order), or InvalidInput."""
    parts = text.split()
    if len(parts) != 5:
        raise InvalidInput(f"crontab {text!r} must have 5 fields: minute hour day month weekday")
    minute, hour, dom, month, dow = parts
    try:
        return Crontab.of(minute, hour, dow, dom, month)
    except InvalidInput as exc:
        raise InvalidInput(f"invalid crontab {text!r}: {exc}") from exc


# -- fingerprint and JSON ------------------------------------------------------------------


def fingerprint(sched: Schedule) -> tuple[Any, ...]:
    """A canonical description for the config hash (its repr is hashed, so it never changes
    for an existing schedule): a crontab by its expanded fields."""
    if isinstance(sched, Crontab):
        return ("crontab", *(tuple(sorted(getattr(sched, f))) for f in
                             ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")))
    if isinstance(sched, Solar):
        return ("solar", sched.event, float(sched.lat), float(sched.lon))
    if isinstance(sched, Interval):
        anchor = ("first_install" if sched.from_first_install else sched.anchor_ms)
        return ("every", sched.seconds) if anchor is None else \
            ("every", sched.seconds, "anchor", anchor)
    if isinstance(sched, Clocked):
        return ("clocked", sched.at_ms)
    raise InvalidInput(f"unsupported schedule type {type(sched).__name__}")


def schedule_to_json(sched: Schedule) -> dict[str, Any]:
    if isinstance(sched, Crontab):
        return {"type": "crontab", **dict(zip(CRON_FIELDS, sched.written, strict=True))}
    if isinstance(sched, Solar):
        return {"type": "solar", "event": sched.event, "lat": sched.lat, "lon": sched.lon}
    if isinstance(sched, Interval):
        out: dict[str, Any] = {"type": "every", "seconds": sched.seconds}
        if sched.anchor_ms is not None:
            out["anchor_ms"] = sched.anchor_ms
        if sched.from_first_install:
            out["anchor"] = "first_install"
        return out
    if isinstance(sched, Clocked):
        return {"type": "clocked", "at_ms": sched.at_ms}
    raise InvalidInput(f"unsupported schedule type {type(sched).__name__}")


def _interval_from_json(d: Mapping[str, Any]) -> Interval:
    anchor = d.get("anchor_ms")
    if d.get("anchor", "epoch") not in ("epoch", "first_install"):
        raise InvalidInput(f"anchor must be epoch or first_install, got {d.get('anchor')!r}")
    return Interval.of(float(d["seconds"]), None if anchor is None else int(anchor),
                       d.get("anchor") == "first_install")


_FROM_JSON: dict[str, Callable[[Mapping[str, Any]], Schedule]] = {
    "crontab": lambda d: Crontab.of(**{f: str(d.get(f, "*")) for f in CRON_FIELDS}),
    "solar": lambda d: Solar(str(d["event"]), float(d["lat"]), float(d["lon"])),
    "every": _interval_from_json,
    "clocked": lambda d: Clocked(int(d["at_ms"])),
}


def schedule_from_json(data: Mapping[str, Any]) -> Schedule:
    """Rebuild a stored schedule; a bad one raises InvalidInput with the reason."""
    kind = data.get("type")
    build = _FROM_JSON.get(str(kind))
    if build is None:
        raise InvalidInput(f"unknown schedule type {kind!r} (expected crontab, every, solar or "
                           "clocked)")
    try:
        return build(data)
    except (ValueError, KeyError, TypeError, InvalidInput) as exc:
        raise InvalidInput(f"invalid {kind} schedule {dict(data)!r}: {exc}") from exc


def describe(definition: Mapping[str, Any] | None) -> str:
    """A stored schedule in one line, for listings."""
    sched = (definition or {}).get("schedule") or {}
    if not sched:
        return ""
    if sched.get("type") == "every":
        anchor = sched.get("anchor") or ("anchored" if "anchor_ms" in sched else "")
        return f"every {sched.get('seconds')}s {anchor}".strip()
    if sched.get("type") == "clocked":
        return f"once at {from_ms(int(sched.get('at_ms') or 0)):%Y-%m-%d %H:%M:%S} UTC"
    if sched.get("type") == "crontab":
        fields = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        return "crontab " + " ".join(str(sched.get(f, "*")) for f in fields)
    return f"solar {sched.get('event')} {sched.get('lat')},{sched.get('lon')}"
