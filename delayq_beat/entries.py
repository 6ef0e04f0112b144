"""Celery's entries in the engine's terms: ``celery.schedules`` objects become the scheduling
engine's schedules (:mod:`delayq_transport.scheduling.schedules`).

``schedule`` (and plain seconds or a timedelta) becomes an interval, ``crontab`` its expanded
fields (so its config hash is the one Celery's own expansion gives), and the crontab's own time
zone when it has one (django-celery-beat's ``TzAwareCrontab``), ``solar`` the same event at the
same place, a clocked schedule (anything with a ``clocked_time``: django-celery-beat's
``clocked``) one instant. The functions here take either kind of schedule, so code written
against Celery's objects keeps working; the time rules are the engine's
(:mod:`..scheduling.times`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, tzinfo
from typing import Any

from celery.schedules import crontab, schedule, solar

from delayq_transport.core import InvalidInput
from delayq_transport.core.queue import to_ms
from delayq_transport.scheduling import entries, schedules, times
from delayq_transport.scheduling.entries import (
    DEFAULT_GRACE_S,
    DEFAULT_MISFIRE,
    DELAYQ_OPTIONS,
    MISFIRE_POLICIES,
    EntrySpec,
    entry_hash,
    entry_name,
    key_prefix,
)
from delayq_transport.scheduling.schedules import Schedule, parse_crontab, schedule_from_json

__all__ = ["DEFAULT_GRACE_S", "DEFAULT_MISFIRE", "DELAYQ_OPTIONS", "MISFIRE_POLICIES",
           "EntrySpec", "entry_hash", "entry_name", "from_celery", "key_prefix", "make_spec",
           "occurrences", "own_zone", "parse_crontab", "schedule_from_json", "schedule_to_json"]


def from_celery(sched: object) -> object:
    """The engine's schedule for a Celery one; anything else is returned as is (the engine
    takes seconds and timedeltas, and refuses what it does not know, by name)."""
    if isinstance(sched, crontab):
        fields = {name: _written(getattr(sched, f"_orig_{name}"), getattr(sched, name))
                  for name in schedules.CRON_FIELDS}
        expanded = {name: frozenset(getattr(sched, name)) for name in schedules.CRON_FIELDS}
        return schedules.Crontab(**expanded, written=tuple(fields.values()))
    if isinstance(sched, solar):
        return schedules.Solar(sched.event, float(sched.lat), float(sched.lon))
    if isinstance(sched, schedule):
        return schedules.Interval.of(sched.run_every)
    clocked_time = getattr(sched, "clocked_time", None)
    if isinstance(clocked_time, datetime):
        return schedules.Clocked(to_ms(clocked_time, what="clocked_time"))
    return sched


def own_zone(sched: object) -> tzinfo | None:
    """The time zone a crontab carries itself (set on the instance, as ``TzAwareCrontab``
    does), else None: the entry is then read in the app's ``timezone``."""
    zone = vars(sched).get("tz") if isinstance(sched, crontab) else None
    return zone if isinstance(zone, tzinfo) else None


def _written(orig: object, expanded: Iterable[int]) -> str:
    """A crontab field as written: the text given, else its values as a comma list."""
    return orig if isinstance(orig, str) else ",".join(str(v) for v in sorted(expanded))


def make_spec(name: str, task: object, sched: object, args: Any = (), kwargs: Any = None,
              options: Any = None, **settings: Any) -> EntrySpec:
    """:func:`~delayq_transport.scheduling.entries.make_spec` for Celery schedules too."""
    if settings.get("zone") is None and own_zone(sched) is not None:
        settings["zone"] = own_zone(sched)
    return entries.make_spec(name, task, from_celery(sched), args, kwargs, options, **settings)


def occurrences(sched: object, after: datetime, until: datetime, zone: tzinfo,
                min_count: int = 3) -> list[datetime]:
    return times.occurrences(_schedule(sched), after, until, zone, min_count)


def schedule_to_json(sched: object) -> dict[str, Any]:
    return schedules.schedule_to_json(_schedule(sched))


def _schedule(sched: object) -> Schedule:
    engine = from_celery(sched)
    if not isinstance(engine, schedules.SCHEDULE_TYPES):
        raise InvalidInput(f"unsupported schedule type {type(sched).__name__}")
    return engine
