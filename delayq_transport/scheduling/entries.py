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
from dataclasses import dataclass, field
from datetime import timedelta, tzinfo
from typing import Any
from urllib.parse import unquote

from ..core.cron import config_hash, validate_prefix
from ..core.errors import InvalidInput
from .schedules import Crontab, Interval, Schedule, Solar, fingerprint

MISFIRE_POLICIES = ("coalesce", "run_all", "skip")
DEFAULT_MISFIRE = "coalesce"
DEFAULT_GRACE_S = 60.0
#: Options that steer delayq and are not passed on to the task message.
DELAYQ_OPTIONS = ("delayq_misfire", "delayq_grace")
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
    is the entry's own time zone (None: the scheduler's)."""

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
) -> EntrySpec:
    """Validate one entry; raises InvalidInput naming the entry and the problem.

    ``sched``: a :data:`~.schedules.Schedule`, or seconds / a timedelta for an interval."""
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
                     misfire, grace, source, zone)


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
    if isinstance(sched, Interval | Crontab | Solar):
        return sched
    raise InvalidInput(
        f"beat entry {name!r}: unsupported schedule type {type(sched).__name__} "
        "(use a number, timedelta, interval, crontab or solar)"
    )


def zone_name(zone: tzinfo) -> str:
    return str(getattr(zone, "key", None) or zone)


def entry_hash(spec: EntrySpec, zone: tzinfo) -> str:
    """Covers everything that shapes an occurrence: task, schedule, args, options, time zone
    (``zone``: the one the entry is evaluated in)."""
    canonical = json.dumps(
        {"args": list(spec.args), "kwargs": spec.kwargs, "options": spec.options,
         "misfire": [spec.misfire, spec.grace_s]},
        sort_keys=True, default=repr,
    )
    return config_hash(_HASH_VERSION, spec.task, fingerprint(spec.schedule), canonical,
                       zone_name(zone))
