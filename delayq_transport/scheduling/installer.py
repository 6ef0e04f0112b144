"""The refresh: turn entries into installed occurrences, uninstall what is gone, catch up what no
scheduler installed, apply misfires.

Any number of installers (threads, processes, Celery beats, Dramatiq schedulers) can run against
one database; the unique ``(pKey, pKind)`` index and ``min_lead`` make each occurrence exist
exactly once whoever installs it. What a message looks like and which queue kind it goes to is
the front end's business: a :class:`Delivery` (Celery beat's builds Celery task messages,
Dramatiq's builds Dramatiq messages); the engine hands it each :class:`Occurrence`.

Schedulers of different configurations at once (a rolling deploy) agree on the one in force
(:mod:`.authority`): a refresh starts with the scheduler's heartbeat, and only the schedulers of
the configuration in force go on; the others install and uninstall nothing.

Per refresh, in steady state, the statements are: the heartbeat (which reads the database
clock), the DB-backed entries, the ledger, one multi-row insert per queue kind (only
occurrences past the ledger's ``installedUntil``; the whole horizon on a process's first
refresh in force), the ledger update and the misfire sweep. A new entry, or one whose config
hash or queue changed, goes through ``CronService.switch``, which replaces its rows under any
other configuration from one instant on; an entry whose ledger ends before now (no scheduler
ran for longer than the horizon) is caught up (:mod:`.catchup`) by one statement that claims
the gap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, tzinfo
from typing import Any

from ..core import DelayqError, InvalidInput
from ..core.integrations import CronMessage, CronService
from ..core.queue import DelayedQueue, Offer, OfferOutcome, from_ms, to_ms
from . import bounds, misfire
from .authority import INVALID, Authority, Lapsed
from .catchup import GapCatcher
from .entries import EntrySpec, entry_hash, key_prefix
from .plans import Delivery, Occurrence, Plan, RefreshReport, Settings
from .schedules import Window
from .store import EntryStore, InstalledEntry
from .times import next_after, occurrences

log = logging.getLogger(__name__)

class Installer:
    """Installs the occurrences of a set of entries into one delayed_queue table."""

    def __init__(
        self,
        queue: DelayedQueue,
        store: EntryStore,
        zone: tzinfo,
        settings: Settings | None = None,
        *,
        delivery: Delivery,
        spec_defaults: Mapping[str, Any] | None = None,
        check_task: Callable[[EntrySpec], None] | None = None,
    ) -> None:
        self.queue = queue
        self.store = store
        #: The zone of entries that have none of their own.
        self.zone = zone
        self.settings = settings or Settings()
        self.delivery = delivery
        self.spec_defaults = dict(spec_defaults or {})
        self.check_task = check_task
        #: (entry, hash, kind) this process has fully installed; others are installed in full.
        self._verified: set[tuple[str, str, str]] = set()
        self.gaps = GapCatcher(queue, store, self.settings, delivery)
        self.authority = Authority(store, self.settings)

    @property
    def caught_up(self) -> dict[str, list[datetime]]:
        """entry -> the runs the last refresh caught up for it (what the log line says)."""
        return self.gaps.caught_up

    def zone_for(self, spec: EntrySpec) -> tzinfo:
        """The time zone an entry's schedule is read in: its own, else the scheduler's."""
        return spec.zone if spec.zone is not None else self.zone

    # -- the refresh ------------------------------------------------------------------

    def refresh(self, config: Mapping[str, EntrySpec | Exception]) -> RefreshReport:
        """One pass; an entry that fails is logged and skipped, the others are installed.
        Nothing is written unless ``config`` is the configuration in force
        (:mod:`.authority`)."""
        report = RefreshReport()
        was_acting = self.authority.acting
        standing = self.authority.heartbeat(self.shapes(config), self.queue.clock_ms())
        if not self.authority.acting:
            report.in_force = False
            return report
        if not was_acting:  # what others did meanwhile is not known: offer whole horizons
            self._verified.clear()
        try:
            self._refresh(config, from_ms(standing.now_ms), report)
        except Lapsed as exc:
            log.warning("%s", exc)
            report.in_force = False
        return report

    def _refresh(self, config: Mapping[str, EntrySpec | Exception], now: datetime,
                 report: RefreshReport) -> None:
        """The refresh of the configuration in force; every write is guarded
        (:meth:`~.authority.Authority.guard`)."""
        specs, broken = self._merge_db_entries(config, report)
        installed = {i.name: i for i in self.store.installed()}
        # First what is gone, then what changed: an entry the configuration in force removed
        # stops before the entries it changed switch (however long this refresh takes).
        self._uninstall([i for name, i in installed.items()
                         if name not in specs and name not in broken], report)
        plans = self._plans(specs, now, installed, report)
        self._guard()
        after_gaps, claimed = self.gaps.catch_up(plans, installed, now, report)
        for plan in claimed:  # their horizon is in: offer only what comes later
            self.verified(plan)
        ledger = self._install(plans, after_gaps, report)
        self._guard()
        self.store.record_installed(ledger)
        self._guard()
        report.misfires_dropped = misfire.sweep(self.queue, [
            (p.route.kind, p.prefix, p.hash, p.spec.misfire, p.spec.grace_ms) for p in plans])

    def _guard(self) -> None:
        self.authority.guard(self.queue.clock_ms())

    def retire(self) -> None:
        """This scheduler stops: its configuration no longer holds authority through it."""
        self.authority.retire(self.queue.clock_ms())

    def shapes(self, config: Mapping[str, EntrySpec | Exception]) -> dict[str, str]:
        """Each entry of the front end's configuration as the authority compares it: its
        config hash and queue kind, or invalid (DB-backed entries are every scheduler's alike,
        so they are left out). No statement is sent."""
        return {name: self._shape(spec) for name, spec in config.items()}

    def _shape(self, spec: EntrySpec | Exception) -> str:
        if not isinstance(spec, EntrySpec):
            return INVALID
        try:
            if self.check_task is not None:
                self.check_task(spec)
            kind = self.delivery.route(spec).kind
            return f"{entry_hash(spec, self.zone_for(spec))}@{kind}{'' if spec.enabled else '-'}"
        except (DelayqError, ValueError, TypeError, LookupError):
            return INVALID

    def _merge_db_entries(
        self, config: Mapping[str, EntrySpec | Exception], report: RefreshReport
    ) -> tuple[dict[str, EntrySpec], set[str]]:
        """Configured entries, overridden by DB-backed ones; disabled ones left out."""
        specs = {n: s for n, s in config.items() if isinstance(s, EntrySpec)}
        broken = {n for n, s in config.items() if not isinstance(s, EntrySpec)}
        for n in broken:
            report.errors[n] = str(config[n])
        for row in self.store.entries():
            if row.definition is not None:
                try:
                    specs[row.name] = row.spec(**self.spec_defaults)
                    broken.discard(row.name)
                except InvalidInput as exc:
                    self._fail(row.name, exc, report, broken)
                    specs.pop(row.name, None)
                    continue
            if not row.enabled:
                specs.pop(row.name, None)
                broken.discard(row.name)
        return specs, broken

    def _fail(self, name: str, exc: Exception, report: RefreshReport, broken: set[str]) -> None:
        log.error("delayq schedule: entry %r skipped: %s", name, exc)
        report.errors[name] = str(exc)
        broken.add(name)

    def _plans(self, specs: Mapping[str, EntrySpec], now: datetime,
               installed: Mapping[str, InstalledEntry], report: RefreshReport) -> list[Plan]:
        """Hash, route, bounds and occurrence times per entry; equal schedules are computed
        once. An entry with nothing left to install (ended, or its one instant passed) has a
        plan without times: it is not gone, so it is not uninstalled."""
        after = now + self.settings.min_lead
        until = now + self.settings.effective_horizon
        cache: dict[tuple[Any, ...], tuple[list[datetime], datetime | None]] = {}
        plans: list[Plan] = []
        for name, spec in specs.items():
            try:
                if self.check_task is not None:
                    self.check_task(spec)
                route = self.delivery.route(spec)
                zone = self.zone_for(spec)
                hash_ = entry_hash(spec, zone)
                bounded = self._bounded(spec, hash_, route.kind, installed.get(name), now,
                                        report)
                key = (bounded, zone)
                if key not in cache:
                    times = occurrences(bounded, after, until, zone,
                                        self.settings.min_occurrences)
                    cache[key] = (times, next_after(bounded, zone, times[-1]) if times else None)
                times, following = cache[key]
                plan = Plan(spec, hash_, route, zone, times, following, bounded)
                if times:
                    self.delivery.encode(plan.occurrences()[0])  # bad options fail here
                plans.append(plan)
            except (DelayqError, ValueError, TypeError, LookupError) as exc:
                self._fail(name, exc, report, set())
        return plans

    def _bounded(self, spec: EntrySpec, hash_: str, kind: str,
                 previous: InstalledEntry | None, now: datetime,
                 report: RefreshReport) -> Window:
        """The entry's window; claims its first install in the ledger when it needs one (one
        statement, on the first refresh of a new or changed entry only), and runs a one-off
        already due when first seen, once whoever sees it first."""
        if not (bounds.needs_first_install(spec) or bounds.single_instant(spec)):
            return bounds.window(spec, None)
        same = previous is not None and (previous.config_hash, previous.kind) == (hash_, kind)
        first = previous.first_installed_ms if same and previous is not None else None
        if same and (first is not None or not bounds.needs_first_install(spec)):
            return bounds.window(spec, first)
        self._guard()
        claim = self.store.first_install(spec.name, kind, hash_, self.queue.clock_ms())
        bounded = bounds.window(spec, claim.at_ms)
        if claim.inserted and bounds.single_instant(spec):
            owed = bounds.owed_at_first_sight(spec, bounded, self.zone_for(spec), now,
                                              self.settings.min_lead)
            if owed:
                self.gaps.run_now(spec, hash_, kind, owed, claim, now, report)
        return bounded

    def _install(self, plans: list[Plan], installed: Mapping[str, InstalledEntry],
                 report: RefreshReport) -> list[InstalledEntry]:
        incremental: dict[str, list[Occurrence]] = {}
        ledger: list[InstalledEntry] = []
        for plan in plans:
            name, kind = plan.spec.name, plan.route.kind
            previous = installed.get(name)
            if not plan.times:
                continue  # ended, or its one instant passed: nothing to install, none gone
            if previous is not None and (previous.config_hash, previous.kind) == (plan.hash, kind):
                # Unchanged config: batch with the other entries. A process's first refresh
                # offers the whole horizon (self-healing), later ones only what is new.
                todo = plan.occurrences()
                if (name, plan.hash, kind) in self._verified:
                    todo = [o for o in todo if o.at_ms > previous.installed_until_ms]
                incremental.setdefault(kind, []).extend(todo)
                self._verified.add((name, plan.hash, kind))
            else:
                self._guard()
                self._install_full(plan, previous, report)
            ledger.append(InstalledEntry(name, kind, plan.hash, to_ms(plan.times[-1]), 0))
        for kind, items in incremental.items():
            self._guard()
            self._offer(kind, items, report)
        return ledger

    def _install_full(self, plan: Plan, previous: InstalledEntry | None,
                      report: RefreshReport) -> None:
        """A new entry, or one whose hash or kind changed: its rows of any other configuration
        are replaced from one instant on (``CronService.switch``), so the occurrences due
        before it run as installed and none is lost or doubled at the change."""
        name, kind = plan.spec.name, plan.route.kind
        if previous is not None and previous.config_hash != plan.hash:
            log.warning("delayq schedule: entry %r config hash changed %s -> %s; replacing its "
                        "future occurrences", name, previous.config_hash, plan.hash)
            report.replaced.append(name)
        service = CronService(self.queue.with_kind(kind), min_lead=self.settings.min_lead)
        batch = [CronMessage(o.at, self.delivery.encode(o)) for o in plan.occurrences()]
        before = [] if previous is None else [previous.kind]
        deleted, created = service.switch(plan.hash, plan.prefix, batch, kinds=before)
        if previous is not None and previous.kind != kind:
            log.info("delayq schedule: entry %r moved from kind %r to %r (%d rows removed)",
                     name, previous.kind, kind, deleted)
        report.installed[name] = len(created)
        self.verified(plan)

    def verified(self, plan: Plan) -> None:
        """This process installed the plan's whole horizon: later refreshes offer only what is
        past the ledger's ``installedUntil``."""
        self._verified.add((plan.spec.name, plan.hash, plan.route.kind))

    def _offer(self, kind: str, items: list[Occurrence], report: RefreshReport) -> None:
        offers = [Offer(o.key, self.delivery.encode(o), o.at) for o in items]
        outcomes = self.queue.with_kind(kind).offer_batch(
            offers, can_update=False, min_lead=self.settings.min_lead)
        for occurrence, outcome in zip(items, outcomes, strict=True):
            if outcome is OfferOutcome.CREATED:
                name = occurrence.spec.name
                report.installed[name] = report.installed.get(name, 0) + 1

    def _uninstall(self, gone: Iterable[InstalledEntry], report: RefreshReport) -> None:
        names = []
        for entry in gone:
            self._guard()
            prefix = _prefix_or_none(entry.name)
            deleted = 0 if prefix is None else CronService(
                self.queue.with_kind(entry.kind)).uninstall(prefix)
            log.warning("delayq schedule: entry %r is gone (removed, renamed or disabled); "
                        "uninstalled %d future occurrences", entry.name, deleted)
            report.uninstalled[entry.name] = deleted
            names.append(entry.name)
        self.store.forget_installed(names)
        self._verified = {v for v in self._verified if v[0] not in report.uninstalled}


def _prefix_or_none(name: str) -> str | None:
    try:
        return key_prefix(name)
    except InvalidInput:
        return None
