"""The refresh: turn entries into installed occurrences, uninstall what is gone, apply misfires.

Kept apart from the Celery ``Scheduler`` so any number of installers (threads, processes,
tests) can run against one database; the unique ``(pKey, pKind)`` index and ``min_lead`` make
each occurrence exist exactly once whoever installs it.

Per refresh, in steady state, the statements are: the database clock, the DB-backed entries,
the ledger, one multi-row insert per queue kind (only occurrences past the ledger's
``installedUntil``; the whole horizon on a process's first refresh), the ledger update and the
misfire sweep. A new entry, or one whose config hash or queue changed, goes through
``CronService.install_tick``, which also deletes its rows under any other hash.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any

from delayq_transport.core.cron import DEFAULT_MIN_LEAD, CronMessage, CronService, cron_key
from delayq_transport.core.errors import DelayqError, InvalidInput
from delayq_transport.core.queue import DelayedQueue
from delayq_transport.core.timeutil import to_ms
from delayq_transport.core.types import Offer
from delayq_transport.formats import celery as messages

from . import misfire
from .entries import EntrySpec, entry_hash, key_prefix, occurrences, schedule_fingerprint
from .store import BeatStore, InstalledEntry

log = logging.getLogger("delayq_beat")

#: Namespace of occurrence task ids: uuid5(NAMESPACE, key), the same in every process.
TASK_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://delayq/beat/occurrence")


def occurrence_task_id(key: str) -> str:
    return str(uuid.uuid5(TASK_ID_NAMESPACE, key))


@dataclass(frozen=True)
class Route:
    """Where an entry's messages go; ``kind`` is the delayed_queue partition the worker polls."""

    queue: str = messages.DEFAULT_QUEUE
    exchange: str = ""
    routing_key: str | None = None
    priority: int | None = None

    @property
    def kind(self) -> str:
        return messages.kind_for(self.queue, self.priority)


def default_route(spec: EntrySpec) -> Route:
    """Routing from the entry's own options only (no app), for tests and the CLI."""
    o = spec.options
    return Route(str(o.get("queue") or messages.DEFAULT_QUEUE), str(o.get("exchange") or ""),
                 o.get("routing_key"), o.get("priority"))


@dataclass(frozen=True)
class Settings:
    refresh_interval: timedelta = timedelta(seconds=60)
    horizon: timedelta = timedelta(hours=1)
    min_occurrences: int = 3
    min_lead: timedelta = DEFAULT_MIN_LEAD

    @property
    def effective_horizon(self) -> timedelta:
        """Always at least two refresh intervals, so one missed refresh leaves no hole."""
        return max(self.horizon, self.refresh_interval * 2)


@dataclass
class Plan:
    """One entry, resolved for this refresh."""

    spec: EntrySpec
    hash: str
    route: Route
    times: list[datetime]

    @property
    def prefix(self) -> str:
        return self.spec.prefix


@dataclass
class RefreshReport:
    installed: dict[str, int] = field(default_factory=dict)   # entry -> rows created
    replaced: list[str] = field(default_factory=list)         # entries whose config changed
    uninstalled: dict[str, int] = field(default_factory=dict)  # entry -> rows deleted
    errors: dict[str, str] = field(default_factory=dict)      # entry -> why it was skipped
    misfires_dropped: int = 0


class Installer:
    """Installs the occurrences of a set of entries into one delayed_queue table."""

    def __init__(
        self,
        queue: DelayedQueue,
        store: BeatStore,
        zone: tzinfo,
        settings: Settings | None = None,
        *,
        route: Callable[[EntrySpec], Route] = default_route,
        spec_defaults: Mapping[str, Any] | None = None,
        check_task: Callable[[EntrySpec], None] | None = None,
    ) -> None:
        self.queue = queue
        self.store = store
        self.zone = zone
        self.settings = settings or Settings()
        self.route = route
        self.spec_defaults = dict(spec_defaults or {})
        self.check_task = check_task
        #: (entry, hash, kind) this process has fully installed; others are installed in full.
        self._verified: set[tuple[str, str, str]] = set()

    def zone_for(self, spec: EntrySpec) -> tzinfo:
        """The time zone of an entry's schedule (Celery beat: one zone for every entry; the
        Dramatiq scheduler overrides this for per-actor zones)."""
        return self.zone

    # -- the refresh ------------------------------------------------------------------

    def refresh(self, config: Mapping[str, EntrySpec | Exception]) -> RefreshReport:
        """One pass; an entry that fails is logged and skipped, the others are installed."""
        report = RefreshReport()
        now = self.queue.now()
        specs, broken = self._merge_db_entries(config, report)
        installed = {i.name: i for i in self.store.installed()}
        plans = self._plans(specs, now, report)
        ledger = self._install(plans, installed, now, report)
        self.store.record_installed(ledger)
        gone = [i for name, i in installed.items() if name not in specs and name not in broken]
        self._uninstall(gone, report)
        report.misfires_dropped = misfire.sweep(self.queue, [
            (p.route.kind, p.prefix, p.hash, p.spec.misfire, int(p.spec.grace_s * 1000))
            for p in plans])
        return report

    def _merge_db_entries(
        self, config: Mapping[str, EntrySpec | Exception], report: RefreshReport
    ) -> tuple[dict[str, EntrySpec], set[str]]:
        """beat_schedule entries, overridden by DB-backed ones; disabled ones left out."""
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
        log.error("delayq beat: entry %r skipped: %s", name, exc)
        report.errors[name] = str(exc)
        broken.add(name)

    def _plans(self, specs: Mapping[str, EntrySpec], now: datetime,
               report: RefreshReport) -> list[Plan]:
        """Hash, route and occurrence times per entry; equal schedules are computed once."""
        after = now + self.settings.min_lead
        until = now + self.settings.effective_horizon
        cache: dict[tuple[Any, ...], list[datetime]] = {}
        plans: list[Plan] = []
        for name, spec in specs.items():
            try:
                if self.check_task is not None:
                    self.check_task(spec)
                route = self.route(spec)
                zone = self.zone_for(spec)
                fingerprint = (schedule_fingerprint(spec.schedule), zone)
                if fingerprint not in cache:
                    cache[fingerprint] = occurrences(spec.schedule, after, until, zone,
                                                     self.settings.min_occurrences)
                plan = Plan(spec, entry_hash(spec, zone), route, cache[fingerprint])
                self._message(plan, plan.times[0])  # bad options fail here, per entry
                plans.append(plan)
            except (DelayqError, ValueError, TypeError, LookupError) as exc:
                self._fail(name, exc, report, set())
        return plans

    def _install(self, plans: list[Plan], installed: Mapping[str, InstalledEntry],
                 now: datetime, report: RefreshReport) -> list[InstalledEntry]:
        incremental: dict[str, list[tuple[Plan, datetime]]] = {}
        ledger: list[InstalledEntry] = []
        for plan in plans:
            name, kind = plan.spec.name, plan.route.kind
            previous = installed.get(name)
            if previous is not None and (previous.config_hash, previous.kind) == (plan.hash, kind):
                # Unchanged config: batch with the other entries. A process's first refresh
                # offers the whole horizon (self-healing), later ones only what is new.
                todo = plan.times
                if (name, plan.hash, kind) in self._verified:
                    todo = [t for t in todo if to_ms(t) > previous.installed_until_ms]
                incremental.setdefault(kind, []).extend((plan, t) for t in todo)
                self._verified.add((name, plan.hash, kind))
            else:
                self._install_full(plan, previous, report)
            ledger.append(InstalledEntry(name, kind, plan.hash, to_ms(plan.times[-1]), 0))
        for kind, items in incremental.items():
            self._offer(kind, items, report)
        return ledger

    def _install_full(self, plan: Plan, previous: InstalledEntry | None,
                      report: RefreshReport) -> None:
        name, kind = plan.spec.name, plan.route.kind
        if previous is not None and previous.kind != kind:
            moved = CronService(self.queue.with_kind(previous.kind)).uninstall(plan.prefix)
            log.info("delayq beat: entry %r moved from kind %r to %r (%d rows removed)",
                     name, previous.kind, kind, moved)
        if previous is not None and previous.config_hash != plan.hash:
            log.warning("delayq beat: entry %r config hash changed %s -> %s; replacing its "
                        "future occurrences", name, previous.config_hash, plan.hash)
            report.replaced.append(name)
        service = CronService(self.queue.with_kind(kind), min_lead=self.settings.min_lead)
        batch = [CronMessage(t, messages.encode(self._message(plan, t))) for t in plan.times]
        outcomes = service.install_tick(plan.hash, plan.prefix, batch, can_update=False)
        report.installed[name] = sum(o.value == "created" for o in outcomes)
        self._verified.add((name, plan.hash, kind))

    def _offer(self, kind: str, items: list[tuple[Plan, datetime]], report: RefreshReport) -> None:
        offers = [Offer(cron_key(p.prefix, p.hash, t), messages.encode(self._message(p, t)), t)
                  for p, t in items]
        outcomes = self.queue.with_kind(kind).offer_batch(
            offers, can_update=False, min_lead=self.settings.min_lead)
        for (plan, _), outcome in zip(items, outcomes, strict=True):
            if outcome.value == "created":
                report.installed[plan.spec.name] = report.installed.get(plan.spec.name, 0) + 1

    def _uninstall(self, gone: Iterable[InstalledEntry], report: RefreshReport) -> None:
        names = []
        for entry in gone:
            prefix = _prefix_or_none(entry.name)
            deleted = 0 if prefix is None else CronService(
                self.queue.with_kind(entry.kind)).uninstall(prefix)
            log.warning("delayq beat: entry %r is gone (removed, renamed or disabled); "
                        "uninstalled %d future occurrences", entry.name, deleted)
            report.uninstalled[entry.name] = deleted
            names.append(entry.name)
        self.store.forget_installed(names)
        self._verified = {v for v in self._verified if v[0] not in report.uninstalled}

    # -- messages ---------------------------------------------------------------------

    def _message(self, plan: Plan, at: datetime) -> dict[str, Any]:
        """A ready-to-run Celery message for one occurrence (task id = uuid5 of its key)."""
        spec, route = plan.spec, plan.route
        key = cron_key(plan.prefix, plan.hash, at)
        task_id = occurrence_task_id(key)
        at_ms = to_ms(at)
        headers = dict(spec.options.get("headers") or {})
        headers["celery_beat_task"] = True
        headers[misfire.HEADER] = misfire.occurrence_header(
            spec.name, plan.prefix, plan.hash, at_ms, spec.misfire, int(spec.grace_s * 1000))
        msg = messages.task_message(
            spec.task, spec.args, spec.kwargs, task_id=task_id,
            expires=_expires(spec, at), queue=route.queue, exchange=route.exchange,
            routing_key=route.routing_key, priority=route.priority,
            origin="delayq-beat", extra_headers=headers,
        )
        msg["properties"]["delivery_tag"] = task_id  # deterministic: same bytes from any beat
        return msg


def _expires(spec: EntrySpec, at: datetime) -> datetime | None:
    """Celery's ``expires``: seconds after the occurrence, or an aware datetime."""
    value = spec.options.get("expires")
    if value is None:
        return None
    if isinstance(value, datetime):
        to_ms(value, what=f"beat entry {spec.name!r}: expires")
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return at + timedelta(seconds=value)
    raise InvalidInput(f"beat entry {spec.name!r}: expires must be seconds or an aware "
                       f"datetime, got {value!r}")


def _prefix_or_none(name: str) -> str | None:
    try:
        return key_prefix(name)
    except InvalidInput:
        return None
