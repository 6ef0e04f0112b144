"""Entries: what to send, when, and how to treat misfires; their key prefixes and config hashes.

An :class:`EntrySpec` is what every front end translates its own entries into (Celery's
``beat_schedule`` and DB-backed entries, Dramatiq's ``@periodic`` actors). Its config hash
covers everything that shapes an occurrence (task, schedule, arguments, options, misfire policy,
time zone), so a changed entry gets new keys and replaces its future occurrences, and an
unchanged one keeps the keys every scheduler computes alike. The hash of an existing entry
never changes between releases (tests/unit/test_scheduling_hashes.py pins some).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, tzinfo
from typing import Any
from urllib.parse import unquote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..core import InvalidInput
from ..core.integrations import config_hash, validate_prefix
from ..core.queue import Option, Options, to_ms
from .schedules import SCHEDULE_TYPES, Interval, Schedule, fingerprint

MISFIRE_POLICIES = ("coalesce", "run_all", "skip")
DEFAULT_MISFIRE = "coalesce"
DEFAULT_GRACE_S = 60.0
ANCHORS = ("epoch", "first_install")
_POLICIES = " | ".join(f"`{p}`" for p in MISFIRE_POLICIES)
#: Options of one entry that steer delayq and are not passed on to the task message: the
#: misfire policy, and the entry's own time zone, bounds (start, end), one-off flag and interval
#: anchor. ``docs/reference/beat-settings.md`` is rendered from it.
ENTRY_OPTIONS = Options(
    Option("delayq_misfire", None, _POLICIES, "This entry's misfire policy.",
           shown="`delayq_beat_misfire`"),
    Option("delayq_grace", None, "seconds", "This entry's grace before an occurrence counts "
           "as misfired.", shown="`delayq_beat_misfire_grace`"),
    Option("delayq_tz", None, "time zone name",
           "The entry's own time zone: its crontab is read on that wall clock (DST included).",
           shown="the app's `timezone`"),
    Option("delayq_anchor", None, " | ".join(f"`{a}`" for a in ANCHORS) + " | aware datetime",
           "Interval entries: where whole periods are counted from. `first_install` is the "
           "time the entry's configuration was first installed, recorded in the ledger so every "
           "beat agrees.", shown="`epoch`, or the start time when one is set"),
    Option("delayq_start_time", None, "aware datetime or ISO-8601 with offset",
           "No occurrence before it; an interval entry without an anchor is anchored at it."),
    Option("delayq_expires", None, "aware datetime or ISO-8601 with offset",
           "The entry ends: no occurrence at or after it (the option `expires` stays each "
           "message's expiry)."),
    Option("delayq_one_off", None, "bool",
           "Only the first occurrence runs (from the start time, else the first after the "
           "entry was first installed).", shown="False"),
)
DELAYQ_OPTIONS = tuple(ENTRY_OPTIONS)
_HASH_VERSION = "delayq-beat-1"


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
    """One validated entry. ``options`` belong to the front end (message options); ``zone``
    is the entry's own time zone (None: the scheduler's); no occurrence is before
    ``start_time`` or at/after ``expires`` (the entry's end, not the messages' expiry); a
    ``one_off`` entry runs its first occurrence only; a disabled one is not installed."""

    name: str
    task: str
    schedule: Schedule
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    misfire: str = DEFAULT_MISFIRE
    grace_s: float = DEFAULT_GRACE_S
    source: str = "config"
    zone: tzinfo | None = None
    start_time: datetime | None = None
    expires: datetime | None = None
    one_off: bool = False
    enabled: bool = True

    @property
    def prefix(self) -> str:
        return key_prefix(self.name)

    @property
    def grace_ms(self) -> int:
        return int(self.grace_s * 1000)


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
    zone: tzinfo | None = None,
    enabled: bool = True,
) -> EntrySpec:
    """Validate one entry; raises InvalidInput naming the entry and the problem.

    ``sched``: a :data:`~.schedules.Schedule`, or seconds / a timedelta for an interval.
    ``options`` may carry :data:`DELAYQ_OPTIONS` (popped: they shape the entry, not its
    messages); ``zone`` wins over ``delayq_tz``."""
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
    what = f"beat entry {name!r}"
    own_zone = _zone(options.pop("delayq_tz", None), f"{what}: delayq_tz")
    zone = zone or own_zone
    start = instant(options.pop("delayq_start_time", None), f"{what}: delayq_start_time")
    end = instant(options.pop("delayq_expires", None), f"{what}: delayq_expires")
    one_off = options.pop("delayq_one_off", False)
    if not isinstance(one_off, bool):
        raise InvalidInput(f"{what}: delayq_one_off must be true or false, got {one_off!r}")
    schedule = _anchored(coerce_schedule(name, sched), options.pop("delayq_anchor", None),
                         start, what)
    return EntrySpec(name, task, schedule, args, kwargs, options, misfire, grace, source, zone,
                     start, end, one_off, enabled)


def _zone(value: object, what: str) -> tzinfo | None:
    """A zone name (IANA) or a tzinfo; None when not given."""
    if value is None or isinstance(value, tzinfo):
        return value
    try:
        return ZoneInfo(str(value))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"{what}: unknown time zone {value!r}") from exc


def instant(value: object, what: str) -> datetime | None:
    """An aware datetime, or its ISO-8601 text with an offset (as stored); None if not given."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise InvalidInput(f"{what}: not an ISO-8601 time: {value!r}") from exc
    if not isinstance(value, datetime):
        raise InvalidInput(f"{what} must be an aware datetime, got {value!r}")
    to_ms(value, what=what)  # refuses a naive one, naming it
    return value


def _anchored(sched: Schedule, anchor: object, start: datetime | None, what: str) -> Schedule:
    """An interval's anchor: ``delayq_anchor`` ("epoch", "first_install" or a time), else the
    start time when there is one (the first run is then at the start, as django-celery-beat
    does), else the epoch."""
    if anchor is None:
        if start is None or not isinstance(sched, Interval) or sched.anchor_ms is not None \
                or sched.from_first_install:
            return sched
        anchor = start
    if not isinstance(sched, Interval):
        raise InvalidInput(f"{what}: delayq_anchor applies to interval schedules only")
    if anchor == "epoch":
        return replace(sched, anchor_ms=None, from_first_install=False)
    if anchor == "first_install":
        return replace(sched, anchor_ms=None, from_first_install=True)
    at = instant(anchor, f"{what}: delayq_anchor (one of {ANCHORS} or a time)")
    return replace(sched, anchor_ms=None if at is None else to_ms(at), from_first_install=False)


def _seconds(value: object, what: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidInput(f"{what} must be a non-negative number of seconds, got {value!r}")
    return float(value)


def coerce_schedule(name: str, sched: object) -> Schedule:
    """Numbers and timedeltas become an :class:`Interval`; other types are refused by name."""
    if isinstance(sched, bool) or sched is None:
        raise InvalidInput(f"beat entry {name!r}: schedule is missing or invalid: {sched!r}")
    try:
        if isinstance(sched, int | float | timedelta):
            return Interval.of(sched)
    except InvalidInput as exc:
        raise InvalidInput(f"beat entry {name!r}: {exc}") from exc
    if isinstance(sched, SCHEDULE_TYPES):
        return sched
    raise InvalidInput(
        f"beat entry {name!r}: unsupported schedule type {type(sched).__name__} "
        "(use a number, timedelta, interval, crontab, solar or clocked)"
    )


def storable_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options as JSON can store them: zones by name, times as ISO-8601 (read back by
    :func:`make_spec` to the same entry)."""
    out = dict(options)
    for key, value in out.items():
        if isinstance(value, datetime):
            out[key] = value.isoformat()
        elif isinstance(value, tzinfo):
            out[key] = zone_name(value)
    return out


def zone_name(zone: tzinfo) -> str:
    return str(getattr(zone, "key", None) or zone)


def entry_hash(spec: EntrySpec, zone: tzinfo) -> str:
    """Covers everything that shapes an occurrence: task, schedule, args, options, time zone
    (``zone``: the one the entry is evaluated in)."""
    shape: dict[str, Any] = {"args": list(spec.args), "kwargs": spec.kwargs,
                             "options": spec.options, "misfire": [spec.misfire, spec.grace_s]}
    bounds = {"start_time": spec.start_time and to_ms(spec.start_time),
              "expires": spec.expires and to_ms(spec.expires), "one_off": spec.one_off or None}
    if any(v is not None for v in bounds.values()):  # only then: older hashes stay as they were
        shape["bounds"] = {k: v for k, v in bounds.items() if v is not None}
    canonical = json.dumps(shape, sort_keys=True, default=repr)
    return config_hash(_HASH_VERSION, spec.task, fingerprint(spec.schedule), canonical,
                       zone_name(zone))
