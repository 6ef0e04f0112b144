"""Periodic tasks of Django's task framework on delayq, declared in the backend's settings and
installed ahead of time by the scheduling engine (:mod:`delayq_transport.scheduling`, which
Celery beat and Dramatiq's periodic actors use too)::

    TASKS = {"default": {
        "BACKEND": "delayq_transport.django.tasks.DelayqBackend",
        "OPTIONS": {"PERIODIC": {
            "morning-report": {"task": "shop.tasks.morning_report",
                               "cron": "30 7 * * mon-fri", "tz": "Europe/Paris"},
            "sweep": {"task": "shop.tasks.sweep", "every": 300, "args": [10]},
        }},
    }}

An entry: ``task`` (the module path of a ``@task``), exactly one of ``cron`` (five fields,
read in ``tz``, default UTC) and ``every`` (seconds, aligned on the epoch); optional ``args``,
``kwargs``, ``queue_name`` and ``priority`` (default: the task's), ``misfire`` (``coalesce``,
the default: of the occurrences missed while no worker ran only the newest runs;
``run_all``; ``skip``) and ``grace`` (seconds an occurrence may be late and still be on time,
default 60).

Every worker process refreshes the entries every minute (``manage.py delayq_worker
--no-scheduler`` turns it off), installing an hour of occurrences ahead: any number of workers
install each occurrence once (its row key is ``<entry>/<config hash>/<epoch ms>``, which is
also its result id), installed occurrences run while no worker schedules, a changed entry's
future occurrences are replaced and a removed entry's deleted; workers of two releases (a
rolling deploy) agree on the newest configuration (:mod:`..scheduling.authority`). A worker
drops a misfired occurrence by its entry's policy before running it.

``OPTIONS["PERIODIC_SOURCE"]`` (``settings``, the default; ``admin``; ``both``) adds, or puts in
their place, django-celery-beat's rows of this backend's tasks, edited in the Django admin
(:mod:`.periodic_admin`); ``OPTIONS["PERIODIC_REFRESH"]`` sets the refresh interval.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils.module_loading import import_string

from ..core import Database, DelayedQueue, Envelope, InvalidInput
from ..formats.django_tasks import PERIODIC_NAMESPACE, kind_of
from ..scheduling.entries import EntrySpec, make_spec
from ..scheduling.installer import Installer
from ..scheduling.misfire import dropped
from ..scheduling.plans import Occurrence, RefreshReport, Settings
from ..scheduling.refresher import RefreshThread
from ..scheduling.schedules import parse_crontab
from ..scheduling.store import EntryStore
from ._framework import Task
from .periodic_admin import DEFAULT_SOURCE, AdminEntries, periodic_source

log = logging.getLogger(__name__)

#: The ledger namespace of these entries (``<table>#django``): Celery beat's and Dramatiq's
#: installers never remove them, nor these theirs.
NAMESPACE = PERIODIC_NAMESPACE
#: The payload field carrying an occurrence's header (what the misfire check reads).
PERIODIC_FIELD = "delayq_periodic"
_PERIODIC_MARK = f'"{PERIODIC_FIELD}"'.encode()
REFRESH_S = 60.0
HORIZON_S = 3600.0
ENTRY_KEYS = frozenset({"task", "cron", "every", "tz", "args", "kwargs", "queue_name",
                        "priority", "misfire", "grace"})


def entry_spec(name: str, entry: Mapping[str, Any]) -> EntrySpec:
    """One entry of ``OPTIONS["PERIODIC"]``, validated; InvalidInput names what is wrong."""
    what = f"periodic task {name!r}"
    if not isinstance(entry, Mapping):
        raise InvalidInput(f"{what}: a dict of task, cron or every, ... expected")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise InvalidInput(f"{what}: unknown key(s) {sorted(unknown)} (known: "
                           f"{sorted(ENTRY_KEYS)})")
    if ("cron" in entry) == ("every" in entry):
        raise InvalidInput(f"{what}: give exactly one of cron and every")
    path = entry.get("task")
    try:
        task = import_string(str(path))
    except ImportError as exc:
        raise InvalidInput(f"{what}: task {path!r} cannot be imported: {exc}") from exc
    if not isinstance(task, Task):
        raise InvalidInput(f"{what}: {path!r} is not a task (decorate it with @task)")
    try:
        zone = ZoneInfo(str(entry.get("tz", "UTC")))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"{what}: unknown time zone {entry.get('tz')!r}") from exc
    schedule: object = parse_crontab(str(entry["cron"])) if "cron" in entry \
        else float(entry["every"])
    queue_name = str(entry.get("queue_name", task.queue_name))
    priority = int(entry.get("priority", task.priority))
    task.using(queue_name=queue_name, priority=priority)  # the backend's own validation
    return make_spec(name, task.module_path, schedule, entry.get("args", ()),
                     entry.get("kwargs"), {
                         "queue": queue_name, "priority": priority, "backend": task.backend,
                         "delayq_misfire": entry.get("misfire", "coalesce"),
                         "delayq_grace": entry.get("grace", 60.0)},
                     source="django", zone=zone)


def entry_specs(entries: Mapping[str, Any]) -> dict[str, EntrySpec | Exception]:
    """Every entry: its spec, or the error that keeps it from being installed."""
    specs: dict[str, EntrySpec | Exception] = {}
    for name, entry in entries.items():
        try:
            specs[str(name)] = entry_spec(str(name), entry)
        except Exception as exc:  # noqa: BLE001 - one bad entry does not stop the others
            specs[str(name)] = exc
    return specs


@dataclass(frozen=True)
class Route:
    """Where an entry's occurrences go: the kind of its queue and priority."""

    kind: str


class TaskDelivery:
    """Occurrences as the worker runs them: the payload of an enqueued task, with the
    occurrence's header and its time as ``run_after``."""

    def route(self, spec: EntrySpec) -> Route:
        return Route(kind_of(str(spec.options["queue"]), int(spec.options["priority"])))

    def encode(self, occurrence: Occurrence) -> bytes:
        spec = occurrence.spec
        return json.dumps({
            "task": spec.task, "args": list(spec.args), "kwargs": dict(spec.kwargs),
            "backend": spec.options["backend"], "queue": spec.options["queue"],
            "priority": spec.options["priority"], "run_after_us": occurrence.at_ms * 1000,
            "enqueued_at": occurrence.at_ms, PERIODIC_FIELD: occurrence.header(),
        }, separators=(",", ":")).encode()


class Scheduler:
    """Installs the periodic entries of one backend into its table, now and then (a thread of
    each worker process): those of its settings, django-celery-beat's rows of its tasks
    (``source`` ``admin``, :mod:`.periodic_admin`), or both (a row over a settings entry of the
    same name, as a Celery beat in admin mode lets the admin win)."""

    def __init__(self, db: Database, queue: DelayedQueue, entries: Mapping[str, Any], *,
                 source: str = DEFAULT_SOURCE, alias: str = "default",
                 refresh_interval: float = REFRESH_S, horizon: float = HORIZON_S) -> None:
        self.entries = dict(entries)
        self.source = periodic_source(source)
        self.refresh_interval = refresh_interval
        settings = Settings(refresh_interval=timedelta(seconds=refresh_interval),
                            horizon=timedelta(seconds=horizon))
        store = EntryStore(db, queue.table, namespace=NAMESPACE, ensure_schema=False)
        self.installer = Installer(queue, store, UTC, settings, delivery=TaskDelivery())
        #: django-celery-beat's rows (admin mode), else None.
        self.admin = AdminEntries(queue, alias) if self.source != "settings" else None
        self._refresher = RefreshThread(self.refresh, refresh_interval, name="delayq-periodic",
                                        what="delayq periodic tasks")

    def specs(self) -> dict[str, EntrySpec | Exception]:
        """The entries of this refresh: the settings', then the admin's over them."""
        specs = entry_specs(self.entries) if self.source != "admin" else {}
        if self.admin is not None:
            specs.update(self.admin.specs())
        return specs

    def refresh(self) -> RefreshReport:
        """One pass: install what is missing, replace what changed, remove what is gone."""
        report = self.installer.refresh(self.specs())
        if report.errors:
            log.error("delayq periodic tasks: entries skipped: %s", report.errors)
        return report

    def start(self) -> Scheduler:
        self._refresher.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop refreshing and retire this scheduler (its heartbeat lapses now)."""
        self._refresher.stop(timeout)
        self.installer.retire()


def misfired_occurrences(queue: DelayedQueue) -> Callable[[list[Envelope]], list[Envelope]]:
    """The session's misfire predicate: the scheduling engine's, for periodic occurrences."""
    return lambda envs: dropped(queue, envs, _periodic_header)


def _periodic_header(payload: bytes) -> object:
    """An occurrence's header in its payload (None: not one, or not JSON: moved aside when
    handed over)."""
    if _PERIODIC_MARK not in payload:
        return None
    try:
        return json.loads(payload).get(PERIODIC_FIELD)
    except (ValueError, AttributeError):
        return None
