"""An entry's bounds made into the :class:`~.schedules.Window` a refresh installs from: its start
time and end (``expires``), one-off entries, and intervals anchored at their first install.

Every scheduler must compute the same instants, so what is not in the entry itself comes from
the ledger: the time the entry's configuration was first installed, claimed once by whichever
scheduler installs it first (:meth:`~.store.EntryStore.first_install`). It anchors an interval
``anchor="first_install"`` (first run one period later, as django-celery-beat counts from the
entry's creation), and places a one-off entry without a start time (its first occurrence after
that install). A one-off's single instant is installed once; once it ran it is never installed
again (it is in the past for every later refresh).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, tzinfo

from ..core.queue import from_ms, to_ms
from .entries import EntrySpec
from .schedules import Clocked, Interval, Window
from .times import occurrences


def needs_first_install(spec: EntrySpec) -> bool:
    """Whether the entry's instants depend on when it was first installed."""
    sched = spec.schedule
    if isinstance(sched, Interval) and sched.from_first_install:
        return True
    return spec.one_off and spec.start_time is None and not isinstance(sched, Clocked)


def single_instant(spec: EntrySpec) -> bool:
    return spec.one_off or isinstance(spec.schedule, Clocked)


def window(spec: EntrySpec, first_installed_ms: int | None) -> Window:
    """The entry's schedule within its bounds; ``first_installed_ms`` when it needs one."""
    sched = spec.schedule
    start = None if spec.start_time is None else to_ms(spec.start_time)
    end = None if spec.expires is None else to_ms(spec.expires)
    if needs_first_install(spec):
        if first_installed_ms is None:
            raise ValueError(f"entry {spec.name!r} needs its first install time")
        if isinstance(sched, Interval) and sched.from_first_install:
            sched = replace(sched, anchor_ms=first_installed_ms, from_first_install=False)
        start = max(start or 0, first_installed_ms + 1)  # strictly after it
    return Window(sched, start, end, spec.one_off)


def owed_at_first_sight(spec: EntrySpec, bounded: Window, zone: tzinfo, now: datetime,
                        min_lead: timedelta) -> list[datetime]:
    """A single-instant entry first seen when its instant is already due (created in the past,
    or while no scheduler ran): what its misfire policy runs of it, as of a missed occurrence
    (``skip``: only within the grace)."""
    lo = bounded.start_ms if bounded.start_ms is not None else (
        bounded.schedule.at_ms if isinstance(bounded.schedule, Clocked) else None)
    if lo is None:
        return []
    found = occurrences(bounded, from_ms(lo - 1), from_ms(lo - 1), zone, 1)
    if not found or found[0] > now + min_lead:
        return []
    late = now - found[0]
    if spec.misfire == "skip" and late > timedelta(seconds=spec.grace_s):
        return []
    return found


def the_instant(spec: EntrySpec, first_installed_ms: int | None,
                zone: tzinfo) -> datetime | None:
    """A single-instant entry's one occurrence (None: not known before its first install, or
    none at all)."""
    if not single_instant(spec) or (needs_first_install(spec) and first_installed_ms is None):
        return None
    bounded = window(spec, first_installed_ms)
    lo = bounded.start_ms if bounded.start_ms is not None else (
        bounded.schedule.at_ms if isinstance(bounded.schedule, Clocked) else None)
    if lo is None:
        return None
    found = occurrences(bounded, from_ms(lo - 1), from_ms(lo - 1), zone, 1)
    return found[0] if found else None
