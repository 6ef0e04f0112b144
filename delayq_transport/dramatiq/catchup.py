"""The misfire policy for occurrences that were never installed: after an outage of every
scheduler longer than the horizon.

Occurrences are installed one horizon ahead, and delayq_beat's misfire policy (``sweep``,
``drop_misfired``) only sees installed rows. When no scheduler refreshes past the end of an
entry's horizon (the workers that run :class:`~.periodic.PeriodicMiddleware` all down, the one
``PeriodicScheduler`` process stopped, the database down), the occurrences after the ledger's
``installedUntil`` are never written, and without this module nothing ran for them at all,
where Celery beat runs one catch-up on restart. The first refresh after such a gap treats them
as if they had been installed and had waited until now, so the policy means the same for both:

* ``coalesce``: one run for the whole gap, at restart: the newest missed occurrence (occurrences
  still within ``grace`` are only late, and run as installed ones would);
* ``skip``: none of those more than ``grace`` late;
* ``run_all``: every one, late; at most :data:`MAX_CATCH_UP` (the newest) per entry.

Exactly once, whoever restarts: the runs and the new horizon are written by one statement that
also compares and sets the entry's ledger row (``PeriodicStore.catch_up``); every scheduler
that read the same ``installedUntil`` computes the same keys (``<entry>/<hash>/<occurrence
ms>``), and only the one whose compare-and-set wins inserts anything.

The worker side (:func:`newer_occurrence_passed`): a worker that comes back before any
scheduler finds the occurrences installed before the outage still waiting. Under ``coalesce``
a misfired one whose entry has a newer occurrence already past is dropped, installed or not:
that newer occurrence is the run (or its catch-up will be), so the outage still runs once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta, tzinfo
from typing import Any

from celery.schedules import BaseSchedule

from delayq_beat.entries import EntrySpec, occurrences
from delayq_beat.installer import Installer, Plan, RefreshReport
from delayq_beat.store import InstalledEntry
from delayq_transport.formats import celery as messages

from ..core.cron import cron_key
from ..core.errors import DelayqError
from ..core.timeutil import from_ms, to_ms

log = logging.getLogger(__name__)

#: Most runs one refresh installs for one entry's gap (``run_all``, or a long grace).
MAX_CATCH_UP = 1000
#: The first window searched back from the end of a gap; each next one is 8 times longer.
_FIRST_WINDOW = timedelta(minutes=5)
_MS = timedelta(milliseconds=1)


def newest_occurrences(schedule: BaseSchedule, zone: tzinfo, after: datetime, until: datetime,
                       limit: int) -> list[datetime]:
    """The newest ``limit`` occurrences in ``(after, until]``, oldest first.

    Searched backwards from ``until`` in growing windows: a gap can be months of a
    one-second interval, and only its end is wanted."""
    span = _FIRST_WINDOW
    while limit > 0 and after < until:
        low = max(after, until - span)
        found = occurrences(schedule, low, until, zone, 0)
        if len(found) >= limit or low <= after:
            return found[-limit:]
        span *= 8
    return []


def catch_up_times(spec: EntrySpec, zone: tzinfo, after: datetime, until: datetime,
                   now: datetime, limit: int = MAX_CATCH_UP) -> list[datetime]:
    """Which never-installed occurrences in ``(after, until]`` run, by the entry's policy."""
    if spec.misfire == "run_all":
        return newest_occurrences(spec.schedule, zone, after, until, limit)
    grace = timedelta(seconds=spec.grace_s)
    # On time: late by at most grace (as drop_misfired counts); ``after`` is exclusive.
    runs = newest_occurrences(spec.schedule, zone, max(after, now - grace - _MS), until, limit)
    if spec.misfire == "coalesce":
        newest_due = newest_occurrences(spec.schedule, zone, after, min(now, until), 1)
        if newest_due and now - newest_due[0] > grace:  # misfired, and no due one on time
            runs = newest_due + runs
    return runs


def newer_occurrence_passed(schedule: BaseSchedule, zone: tzinfo, at_ms: int,
                            now_ms: int) -> bool:
    """Whether the schedule's next occurrence after ``at_ms`` is at or before ``now_ms``."""
    after = from_ms(at_ms)
    following = occurrences(schedule, after, after, zone, 1)
    return bool(following) and to_ms(following[0]) <= now_ms


class CatchUpInstaller(Installer):
    """delayq_beat's installer plus the catch-up of gaps (written against its API only, so
    delayq_beat's own Installer could take it as is)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: entry -> the runs the last refresh caught up for it (what the log line says).
        self.caught_up: dict[str, list[datetime]] = {}

    def _install(self, plans: list[Plan], installed: Mapping[str, InstalledEntry],
                 now: datetime, report: RefreshReport) -> list[InstalledEntry]:
        self.caught_up = {}
        gap_end = now + self.settings.min_lead  # the regular install starts after this
        current = dict(installed)
        for plan in plans:
            previous = installed.get(plan.spec.name)
            if previous is None or (previous.config_hash, previous.kind) != (
                    plan.hash, plan.route.kind):
                continue  # new or changed: nothing of this configuration was missed
            if previous.installed_until_ms < to_ms(gap_end):
                moved = self._catch_up(plan, previous, now, gap_end, report)
                if moved is not None:
                    current[plan.spec.name] = moved
        return super()._install(plans, current, now, report)

    def _catch_up(self, plan: Plan, previous: InstalledEntry, now: datetime,
                  gap_end: datetime, report: RefreshReport) -> InstalledEntry | None:
        """Claim the gap after ``previous.installed_until_ms``: install its runs and the new
        horizon in one statement. None if another scheduler claimed it first."""
        spec, kind = plan.spec, plan.route.kind
        gap_start = from_ms(previous.installed_until_ms)
        try:
            runs = catch_up_times(spec, self.zone_for(spec), gap_start, gap_end, now)
        except (DelayqError, ValueError, TypeError, LookupError) as exc:
            # One entry's schedule never stops the others; its horizon still installs.
            log.error("delayq periodic: entry %r: gap not caught up: %s", spec.name, exc)
            return None
        offers = [(cron_key(plan.prefix, plan.hash, at), messages.encode(self._message(plan, at)),
                   at) for at in [*runs, *plan.times]]
        until_ms = to_ms(plan.times[-1])
        created = self.store.rows.catch_up(
            previous, until_ms, to_ms(gap_end), offers,
            min_lead_ms=self.settings.min_lead // timedelta(milliseconds=1),
            now_ms=to_ms(now) if self.queue.clock is not None else None)
        if created is None:
            log.info("delayq periodic: entry %r: another scheduler caught up its gap", spec.name)
            return None
        self.caught_up[spec.name] = runs
        report.installed[spec.name] = report.installed.get(spec.name, 0) + len(created)
        self._verified.add((spec.name, plan.hash, kind))  # the horizon is in: offer only later
        log.warning("delayq periodic: entry %r had no occurrence installed after %s up to %s "
                    "(no scheduler ran); misfire=%s: %d catch-up run(s)%s", spec.name,
                    gap_start.isoformat(), gap_end.isoformat(), spec.misfire, len(runs),
                    f", newest for {runs[-1].isoformat()}" if runs else "")
        return InstalledEntry(spec.name, kind, plan.hash, until_ms, 0)
