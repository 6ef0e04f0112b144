"""The misfire policy for occurrences that were never installed: after an outage of every
scheduler longer than the horizon.

Occurrences are installed one horizon ahead, and the misfire policy of :mod:`.misfire` only
sees installed rows. When no scheduler refreshes past the end of an entry's horizon (every
Celery beat down, every Dramatiq scheduler down, the database down), the occurrences after the
ledger's ``installedUntil`` are never written. The first refresh after such a gap treats them as
if they had been installed and had waited until now, so the policy means the same for both, and
the same as Celery's PersistentScheduler's one catch-up run at restart:

* ``coalesce``: one run for the whole gap, at restart: the newest missed occurrence (occurrences
  still within the grace are only late, and run as installed ones would);
* ``skip``: none of those more than the grace late;
* ``run_all``: every one, late; at most :data:`MAX_CATCH_UP` (the newest) per entry.

Exactly once, whoever restarts: the runs and the new horizon are written by one statement that
also compares and sets the entry's ledger row (``PeriodicStore.catch_up``); every scheduler
that read the same ``installedUntil`` computes the same keys (``<entry>/<hash>/<occurrence
ms>``), and only the one whose compare-and-set wins inserts anything.

The worker side: a worker that comes back before any scheduler finds the occurrences installed
before the outage still waiting. Under ``coalesce`` a misfired one whose entry has a newer
occurrence already past (its header's ``next_ms``) is dropped, installed or not: that newer
occurrence is the run (or its catch-up will be), so the outage still runs once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta, tzinfo

from ..core import DelayqError
from ..core.integrations import FirstInstall
from ..core.queue import DelayedQueue, from_ms, to_ms
from .entries import EntrySpec
from .plans import Delivery, Occurrence, Plan, RefreshReport, Settings
from .store import EntryStore, InstalledEntry
from .times import Timed, newest_occurrences

log = logging.getLogger(__name__)

#: Most runs one refresh installs for one entry's gap (``run_all``, or a long grace).
MAX_CATCH_UP = 1000
_MS = timedelta(milliseconds=1)


def catch_up_times(spec: EntrySpec, zone: tzinfo, after: datetime, until: datetime,
                   now: datetime, limit: int = MAX_CATCH_UP,
                   schedule: Timed | None = None) -> list[datetime]:
    """Which never-installed occurrences in ``(after, until]`` run, by the entry's policy
    (``schedule``: the entry's, within its bounds; default its plain schedule)."""
    sched = spec.schedule if schedule is None else schedule
    if spec.misfire == "run_all":
        return newest_occurrences(sched, zone, after, until, limit)
    grace = timedelta(seconds=spec.grace_s)
    # On time: late by at most grace (as the worker's check counts); ``after`` is exclusive.
    runs = newest_occurrences(sched, zone, max(after, now - grace - _MS), until, limit)
    if spec.misfire == "coalesce":
        newest_due = newest_occurrences(sched, zone, after, min(now, until), 1)
        if newest_due and now - newest_due[0] > grace:  # misfired, and no due one on time
            runs = newest_due + runs
    return runs


class GapCatcher:
    """An installer's catch-up of the gaps its entries' ledgers show."""

    def __init__(self, queue: DelayedQueue, store: EntryStore, settings: Settings,
                 delivery: Delivery) -> None:
        self.queue = queue
        self.store = store
        self.settings = settings
        self.delivery = delivery
        #: entry -> the runs the last refresh caught up for it (what the log line says).
        self.caught_up: dict[str, list[datetime]] = {}

    def catch_up(self, plans: list[Plan], installed: Mapping[str, InstalledEntry],
                 now: datetime, report: RefreshReport
                 ) -> tuple[dict[str, InstalledEntry], list[Plan]]:
        """Claim every gap before ``now + min_lead``; returns the ledger as it is after, and
        the plans whose horizon the claims installed."""
        self.caught_up = {}
        gap_end = now + self.settings.min_lead  # the regular install starts after this
        current = dict(installed)
        claimed = []
        for plan in plans:
            previous = installed.get(plan.spec.name)
            if previous is None or (previous.config_hash, previous.kind) != (
                    plan.hash, plan.route.kind):
                continue  # new or changed: nothing of this configuration was missed
            if previous.installed_until_ms < to_ms(gap_end):
                moved = self._claim(plan, previous, now, gap_end, report)
                if moved is not None:
                    current[plan.spec.name] = moved
                    claimed.append(plan)
        return current, claimed

    def _claim(self, plan: Plan, previous: InstalledEntry, now: datetime,
               gap_end: datetime, report: RefreshReport) -> InstalledEntry | None:
        """Claim the gap after ``previous.installed_until_ms``: install its runs and the new
        horizon in one statement. None if another scheduler claimed it first."""
        spec, kind = plan.spec, plan.route.kind
        gap_start = from_ms(previous.installed_until_ms)
        try:
            runs = catch_up_times(spec, plan.zone, gap_start, gap_end, now,
                                  schedule=plan.bounded)
        except (DelayqError, ValueError, TypeError, LookupError) as exc:
            # One entry's schedule never stops the others; its horizon still installs.
            log.error("delayq schedule: entry %r: gap not caught up: %s", spec.name, exc)
            return None
        if not runs and not plan.times:
            return None  # ended (or its one instant is past) with nothing owed
        offers = [(o.key, self.delivery.encode(o), o.at) for o in plan.occurrences(runs)]
        until_ms = to_ms(plan.times[-1]) if plan.times else max(
            previous.installed_until_ms, to_ms(runs[-1]))
        created = self.store.catch_up(
            previous, until_ms, to_ms(gap_end), offers,
            min_lead_ms=self.settings.min_lead // _MS,
            now_ms=to_ms(now) if self.queue.clock is not None else None)
        if created is None:
            log.info("delayq schedule: entry %r: another scheduler caught up its gap", spec.name)
            return None
        self.caught_up[spec.name] = runs
        report.installed[spec.name] = report.installed.get(spec.name, 0) + len(created)
        log.warning("delayq schedule: entry %r had no occurrence installed after %s up to %s "
                    "(no scheduler ran); misfire=%s: %d catch-up run(s)%s", spec.name,
                    gap_start.isoformat(), gap_end.isoformat(), spec.misfire, len(runs),
                    f", newest for {runs[-1].isoformat()}" if runs else "")
        return InstalledEntry(spec.name, kind, plan.hash, until_ms, 0)

    def run_now(self, spec: EntrySpec, hash_: str, kind: str, runs: list[datetime],
                claim: FirstInstall, now: datetime, report: RefreshReport) -> None:
        """Install ``runs`` due at once for a one-off first seen past its instant; called by
        the one scheduler whose first-install claim it was, so it happens once."""
        route = self.delivery.route(spec)
        owed = [Occurrence(spec, route, hash_, at, None) for at in runs]
        offers = [(o.key, self.delivery.encode(o), o.at) for o in owed]
        seen = InstalledEntry(spec.name, kind, hash_, claim.installed_until_ms, 0)
        created = self.store.catch_up(
            seen, claim.installed_until_ms, to_ms(now + self.settings.min_lead), offers,
            min_lead_ms=self.settings.min_lead // _MS,
            now_ms=to_ms(now) if self.queue.clock is not None else None)
        report.installed[spec.name] = report.installed.get(spec.name, 0) + len(created or ())
        log.warning("delayq schedule: one-off entry %r first seen %s after its time; misfire=%s: "
                    "%d run(s)", spec.name, now - runs[-1], spec.misfire, len(created or ()))
