"""Periodic Dramatiq actors: cron expressions or intervals, time-zone aware, exactly once.

    @periodic(cron="30 7 * * mon-fri", tz="Europe/Paris")
    @dramatiq.actor
    def morning_report(): ...

Occurrences are installed ahead of time (an hour by default, at least three) as ordinary
Dramatiq messages whose rows are due at the occurrence, by the scheduling engine
(:mod:`delayq_transport.scheduling`, which Celery beat uses too): keys are ``<entry>/<config
hash>/<epoch ms>``, so any number of schedulers (a thread in every worker process with
:class:`PeriodicMiddleware`, or separate processes running :class:`PeriodicScheduler`) install
each occurrence exactly once, and installed occurrences run while every scheduler is down.
Changing an entry (schedule, zone, args, options) changes its hash and replaces its future
occurrences; removing it uninstalls them at the next refresh. Workers of two releases (a
rolling deploy) agree on the newest configuration (:mod:`delayq_transport.scheduling.authority`).
The engine's misfire policy applies (``misfire="coalesce"`` by default, ``"run_all"``,
``"skip"``; ``grace`` seconds), also to the occurrences never installed while no scheduler ran
for longer than the horizon (:mod:`delayq_transport.scheduling.catchup`: ``coalesce`` runs
once at restart). This module is the Dramatiq front end: the decorator, the messages
(:class:`DramatiqDelivery`), the scheduler thread or process and the middleware.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import dramatiq
from dramatiq.middleware import Middleware

from ..core import InvalidInput
from ..formats import dramatiq as names
from ..scheduling.entries import EntrySpec, make_spec
from ..scheduling.installer import Installer
from ..scheduling.plans import Occurrence, RefreshReport, Settings
from ..scheduling.refresher import RefreshThread
from ..scheduling.schedules import parse_crontab
from .broker import DelayqBroker
from .ledger import DramatiqLedger
from .registry import REGISTRY, PeriodicEntry, superseded

__all__ = ["REGISTRY", "DramatiqDelivery", "PeriodicEntry", "PeriodicMiddleware",
           "PeriodicScheduler", "periodic", "superseded"]

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 60.0
DEFAULT_HORIZON_S = 3600.0


def periodic(
    *,
    cron: str | None = None,
    every: timedelta | float | None = None,
    tz: str | tzinfo = "UTC",
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    misfire: str = "coalesce",
    grace: float = 60.0,
    **options: Any,
) -> Any:
    """Declare a Dramatiq actor periodic (put it above ``@dramatiq.actor``).

    Parameters:
      cron: five fields ``minute hour day-of-month month day-of-week`` read in ``tz``
        (Celery crontab semantics; DST as Celery beat on delayq). Exactly one of ``cron``
        and ``every``.
      every: seconds or a timedelta, aligned on the epoch (00:00, 00:05, ...) so every
        scheduler agrees.
      tz: the time zone ``cron`` is read in (a name or a ``tzinfo``).
      args, kwargs: the messages' arguments.
      name: the entry's name (default ``dramatiq:<actor name>``).
      misfire: ``coalesce`` (of the occurrences late by more than ``grace``, only the newest
        runs), ``run_all`` or ``skip``.
      grace: seconds an occurrence may be late and still count as on time.
      options: the messages' options (``max_retries``, ``time_limit``, ``broker_priority``...).
    """
    if (cron is None) == (every is None):
        raise InvalidInput("periodic() needs exactly one of cron= or every=")
    zone = ZoneInfo(tz) if isinstance(tz, str) else tz
    schedule: object = parse_crontab(cron) if cron is not None else every

    def decorate(actor: dramatiq.Actor[Any, Any]) -> dramatiq.Actor[Any, Any]:
        _check_actor(actor)
        entry = name or f"{names.NAMESPACE}:{actor.actor_name}"
        spec = make_spec(entry, actor.actor_name, schedule, tuple(args), dict(kwargs or {}),
                         {**options, "queue": actor.queue_name, "delayq_misfire": misfire,
                          "delayq_grace": grace}, source="dramatiq", zone=zone)
        REGISTRY[entry] = PeriodicEntry(spec, zone, actor)
        return actor

    return decorate


def _check_actor(actor: object) -> None:
    """Below ``@dramatiq.actor``, ``periodic`` would get the plain function, and the actor
    Dramatiq builds from it afterwards never reaches the registry: refuse at import time,
    naming the fix, rather than install nothing without a word."""
    if isinstance(getattr(actor, "__actor__", actor), dramatiq.Actor):
        return  # an actor, or a GenericActor instance (it forwards to its actor)
    what = getattr(actor, "__qualname__", None) or repr(actor)
    raise TypeError(
        f"@periodic must be placed above @dramatiq.actor, not below it: it was given {what}, "
        "which is not a Dramatiq actor. Write\n"
        "    @periodic(...)\n"
        "    @dramatiq.actor(...)\n"
        f"    def {getattr(actor, '__name__', 'fn')}(...): ...")


@dataclass(frozen=True)
class DramatiqRoute:
    """An entry's Dramatiq queue and priority (``broker_priority``), and the kind they make."""

    queue: str
    priority: int = 0
    namespace: str = names.NAMESPACE

    @property
    def kind(self) -> str:
        return names.kind_for(self.queue, self.priority, self.namespace)


class DramatiqDelivery:
    """Dramatiq messages (JSON fields) with a deterministic id: uuid5 of the row key."""

    def __init__(self, namespace: str = names.NAMESPACE) -> None:
        self.namespace = namespace

    def route(self, spec: EntrySpec) -> DramatiqRoute:
        priority = spec.options.get("broker_priority") or 0
        return DramatiqRoute(str(spec.options["queue"]), int(priority), self.namespace)

    def encode(self, occurrence: Occurrence) -> bytes:
        spec = occurrence.spec
        options = {k: v for k, v in spec.options.items() if k != "queue"}
        options[names.PERIODIC_OPTION] = occurrence.header()
        return json.dumps({
            "queue_name": occurrence.route.queue, "actor_name": spec.task,
            "args": list(spec.args), "kwargs": dict(spec.kwargs), "options": options,
            "message_id": occurrence.task_id, "message_timestamp": occurrence.at_ms}).encode()


def _installer(broker: DelayqBroker, settings: Settings) -> Installer:
    """The engine's installer for one broker's periodic actors (each in its own zone)."""
    store = DramatiqLedger(broker.db, broker.table, ensure_schema=True)
    return Installer(broker.queue, store, UTC, settings,
                     delivery=DramatiqDelivery(broker.namespace))


class PeriodicScheduler:
    """Installs the periodic actors of one broker; run one anywhere, or several.

    Parameters:
      broker: the ``DelayqBroker`` whose declared actors it installs.
      refresh_interval: seconds between refreshes.
      horizon: seconds of occurrences installed ahead (at least five refresh intervals).
      min_occurrences: occurrences installed per entry at least, however long the horizon.
      entries: the entries to install instead of every ``@periodic`` actor of the broker.
    """

    def __init__(
        self,
        broker: DelayqBroker,
        *,
        refresh_interval: float = DEFAULT_REFRESH_S,
        horizon: float = DEFAULT_HORIZON_S,
        min_occurrences: int = 3,
        entries: Mapping[str, PeriodicEntry] | None = None,
    ) -> None:
        self.broker = broker
        self.refresh_interval = refresh_interval
        self._entries = entries
        settings = Settings(refresh_interval=timedelta(seconds=refresh_interval),
                            horizon=timedelta(seconds=horizon), min_occurrences=min_occurrences)
        self.installer = _installer(broker, settings)
        self._refresher = RefreshThread(self.refresh, refresh_interval,
                                        name="delayq-dramatiq-periodic", what="delayq periodic")

    def entries(self) -> dict[str, PeriodicEntry]:
        """The registered entries whose actor is declared on this broker."""
        if self._entries is not None:
            return dict(self._entries)
        return {n: e for n, e in REGISTRY.items() if e.actor.broker is self.broker}

    def refresh(self) -> RefreshReport:
        """One pass: install what is missing, replace what changed, remove what is gone."""
        entries = self.entries()
        report = self.installer.refresh({n: e.spec for n, e in entries.items()})
        if report.errors:
            log.error("delayq periodic: entries skipped: %s", report.errors)
        return report

    def run_forever(self) -> None:
        """Refresh every ``refresh_interval`` until :meth:`stop` (a failed refresh is logged)."""
        self._refresher.run()

    def start(self) -> PeriodicScheduler:
        """Refresh in a daemon thread of this process."""
        self._refresher.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the refresh thread and retire this scheduler (its heartbeat lapses now)."""
        self._refresher.stop(timeout)
        self.installer.retire()


class PeriodicMiddleware(Middleware):
    """Runs a :class:`PeriodicScheduler` inside every worker process (no extra process).

    Parameters:
      scheduler_options: :class:`PeriodicScheduler`'s ``refresh_interval``, ``horizon`` and
        ``min_occurrences``.
    """

    def __init__(self, **scheduler_options: Any) -> None:
        self.options = scheduler_options
        self.scheduler: PeriodicScheduler | None = None

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if not isinstance(broker, DelayqBroker):
            raise TypeError("PeriodicMiddleware needs the DelayqBroker")
        self.scheduler = PeriodicScheduler(broker, **self.options).start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
