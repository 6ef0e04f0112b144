"""Celery beat entries (``beat_schedule``'s, a schedule file's, RedBeat's) carried into the
engine's terms, or refused with the reason, for ``delayq beat import``'s sources
(:mod:`.sources`, :mod:`.source_redbeat`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, tzinfo
from typing import Any, Protocol

from delayq_transport.core import InvalidInput
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


