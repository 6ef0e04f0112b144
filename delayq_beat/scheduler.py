"""``celery beat -S delayq_beat.Scheduler``: install occurrences ahead instead of publishing.

Celery's beat sends each task when it is due, from one process. This scheduler never publishes:
every ``delayq_beat_refresh_interval`` it writes the coming occurrences of every entry into
``delayed_queue`` (see :mod:`delayq_beat.installer`), where workers on the
``delayq+postgresql://`` broker pick them up at their time. Any number of beats may run; a beat
that stops leaves a horizon of installed occurrences behind that still run on time.

Settings (``app.conf``): :data:`delayq_beat.conf.BEAT_SETTINGS` declares each with its default
(rendered in docs/reference/beat-settings.md).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from celery import beat
from celery.exceptions import ImproperlyConfigured, QueueNotFound
from kombu import Exchange

from delayq_transport.core import DelayqError, InvalidInput
from delayq_transport.core.db import Database
from delayq_transport.core.integrations import prune_run_claims
from delayq_transport.core.queue import DelayedQueue
from delayq_transport.formats import celery as messages
from delayq_transport.scheduling import djbeat
from delayq_transport.scheduling.djbeat import DjangoBeatSource

from .conf import setting
from .entries import EntrySpec, make_spec
from .installer import Installer, RefreshReport, Route, Settings
from .source_changes import SourceWatch
from .store import BeatStore

log = logging.getLogger("delayq_beat")

#: After a failed refresh (database down), try again this soon rather than a full interval.
RETRY_AFTER_FAILURE_S = 5.0
#: Admin mode: old claims of occurrences written to run history are pruned every this many
#: refreshes (one bounded statement).
PRUNE_EVERY = 60


def settings_from(app: Any) -> Settings:
    def seconds(name: str) -> timedelta:
        value = setting(app, name)
        value = value if isinstance(value, timedelta) else timedelta(seconds=float(value))
        if value <= timedelta(0):
            raise ImproperlyConfigured(f"{name} must be positive, got {value}")
        return value

    return Settings(
        refresh_interval=seconds("delayq_beat_refresh_interval"),
        horizon=seconds("delayq_beat_horizon"),
        min_occurrences=max(1, int(setting(app, "delayq_beat_min_occurrences"))),
    )


def database_url(app: Any) -> str:
    """The broker URL unless told otherwise. A failover list (Celery's ``broker_url`` as a
    list, or ``a;b``) is kept whole: the Database turns it into one libpq multi-host URL, so
    beat follows a failover as the workers do (it took only the first URL before issue 26)."""
    url = setting(app, "delayq_beat_database_url") or app.conf.broker_write_url \
        or app.conf.broker_url
    if isinstance(url, list | tuple):
        url = ";".join(str(u) for u in url) if url else None
    if not url:
        raise ImproperlyConfigured(
            "delayq beat needs a database: set broker_url='delayq+postgresql://...' "
            "or delayq_beat_database_url")
    return str(url)


def table_name(app: Any) -> str:
    options = app.conf.broker_transport_options or {}
    return str(setting(app, "delayq_beat_table") or options.get("table") or "delayed_queue")


class Scheduler(beat.Scheduler):
    """A Celery beat scheduler whose ``tick`` is a refresh of the installed occurrences."""

    def __init__(self, app: Any, *args: Any, schedule_filename: str | None = None,
                 **kwargs: Any) -> None:
        self.settings = settings_from(app)
        self._queue: DelayedQueue | None = None
        self._installer: Installer | None = None
        self._next_refresh = 0.0  # monotonic; 0 = refresh on the first tick
        self._warned_tasks: set[str] = set()
        self._source: DjangoBeatSource | None = None
        self._watch: SourceWatch | None = None
        self._refreshes = 0
        self.last_report: RefreshReport | None = None
        super().__init__(app, *args, **kwargs)
        self.max_interval: float = min(
            float(self.max_interval), self.settings.refresh_interval.total_seconds()
        )

    # -- celery.beat.Scheduler interface ----------------------------------------------

    def setup_schedule(self) -> None:
        """Read beat_schedule entry by entry (one bad entry never stops the others)."""
        self.data: dict[str, Any] = {}
        self.install_default_entries(self.data)
        for name, raw in (self.app.conf.beat_schedule or {}).items():
            try:
                self.data[name] = self.Entry(**dict(raw, name=name, app=self.app))
            except Exception as exc:
                log.error("delayq beat: entry %r skipped: %s", name, exc)
                self.data[name] = exc
        self._open()

    def _open(self) -> None:
        url, table = database_url(self.app), table_name(self.app)
        pool_size = int(setting(self.app, "delayq_beat_pool_size"))
        queue = DelayedQueue(Database(url, min_size=0, max_size=pool_size), table=table,
                             owns_database=True)
        store = BeatStore(queue.db, table)  # registers and applies migration 10
        self._source = self._open_source(queue, table)
        # Import mode: say when an imported django-celery-beat task was edited there since.
        self._watch = SourceWatch(queue.db, store, table) if self._source is None else None
        self._queue = queue
        self._installer = Installer(
            queue, store, self.app.timezone, self.settings, route=self.route,
            spec_defaults=self._spec_defaults(), check_task=self.check_task)

    def _open_source(self, queue: DelayedQueue, table: str) -> DjangoBeatSource | None:
        source = setting(self.app, "delayq_beat_source")
        if source is None:
            return None
        if source != djbeat.SOURCE:
            raise ImproperlyConfigured(f"delayq_beat_source must be {djbeat.SOURCE!r} or None, "
                                       f"got {source!r}")
        return DjangoBeatSource(queue.db, table)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Refresh when due; return the seconds until the next refresh."""
        now = time.monotonic()
        if now >= self._next_refresh:
            delay = self.settings.refresh_interval.total_seconds()
            try:
                self.refresh()
            except DelayqError as exc:
                log.error("delayq beat: refresh failed, retrying in %.0fs: %s",
                          RETRY_AFTER_FAILURE_S, exc)
                delay = min(delay, RETRY_AFTER_FAILURE_S)
            self._next_refresh = now + delay
        return max(0.0, min(self._next_refresh - time.monotonic(), self.max_interval))

    def refresh(self) -> RefreshReport:
        assert self._installer is not None, "setup_schedule() was not called"
        report = self._installer.refresh(self.config_specs())
        self.last_report = report
        log.info("delayq beat: refreshed: %d occurrences installed, %d entries replaced, "
                 "%d uninstalled, %d misfires dropped, %d entries with errors",
                 sum(report.installed.values()), len(report.replaced),
                 len(report.uninstalled), report.misfires_dropped, len(report.errors))
        if self._watch is not None:
            try:
                self._watch.check()
            except DelayqError as exc:  # the occurrences are installed: only the check failed
                log.warning("delayq beat: could not compare imported entries with their "
                            "source: %s", exc)
        return report

    def close(self) -> None:
        """Retire this beat (the configuration in force need not wait for its heartbeat to
        lapse: a rollback hands over at once), then close its pool."""
        try:
            super().close()
        finally:
            if self._installer is not None and self._queue is not None:
                self._installer.retire()
            if self._queue is not None:
                self._queue.close()
                self._queue = None

    @property
    def info(self) -> str:
        s = self.settings
        return (f"    . delayq: refresh every {s.refresh_interval.total_seconds():.0f}s, "
                f"horizon {s.effective_horizon.total_seconds():.0f}s, "
                f"table {table_name(self.app)}")

    # -- entries ----------------------------------------------------------------------

    def _spec_defaults(self) -> dict[str, Any]:
        return {
            "default_misfire": setting(self.app, "delayq_beat_misfire"),
            "default_grace_s": float(setting(self.app, "delayq_beat_misfire_grace")),
        }

    def config_specs(self) -> dict[str, EntrySpec | Exception]:
        """``beat_schedule``'s entries, then django-celery-beat's (admin mode) over them."""
        specs = self._schedule_specs()
        if self._source is not None:
            specs.update(self._source_specs(self._source))
        return specs

    def _source_specs(self, source: DjangoBeatSource) -> dict[str, EntrySpec | Exception]:
        """Every enabled periodic task of django-celery-beat's tables (re-read when its change
        mark moved); a task that cannot be carried is an error of that entry alone."""
        specs: dict[str, EntrySpec | Exception] = {}
        for name, entry in source.entries().items():
            if isinstance(entry, Exception):
                specs[name] = entry
                continue
            try:
                specs[name] = make_spec(name, entry.task, entry.schedule, entry.args,
                                        entry.kwargs, entry.options, source=djbeat.SOURCE,
                                        **self._spec_defaults())
            except InvalidInput as exc:
                specs[name] = exc
        self._refreshes += 1
        if self._refreshes % PRUNE_EVERY == 1 and self._queue is not None:
            prune_run_claims(self._queue.db, self._queue.queries)
        return specs

    def _schedule_specs(self) -> dict[str, EntrySpec | Exception]:
        specs: dict[str, EntrySpec | Exception] = {}
        for name, entry in self.data.items():
            if isinstance(entry, Exception):
                specs[name] = entry
                continue
            try:
                specs[name] = make_spec(name, entry.task, entry.schedule, entry.args,
                                        entry.kwargs, entry.options, **self._spec_defaults())
            except InvalidInput as exc:
                log.error("delayq beat: entry %r skipped: %s", name, exc)
                specs[name] = exc
        return specs

    def check_task(self, spec: EntrySpec) -> None:
        """Unknown task: an error when the app's registry holds user tasks, else a warning."""
        if not setting(self.app, "delayq_beat_check_tasks") or spec.task in self.app.tasks:
            return
        if any(not name.startswith("celery.") for name in self.app.tasks):
            raise InvalidInput(f"beat entry {spec.name!r}: unknown task {spec.task!r} (not in "
                               "the app's task registry; set delayq_beat_check_tasks=False "
                               "if workers import it from elsewhere)")
        if spec.task not in self._warned_tasks:
            self._warned_tasks.add(spec.task)
            log.warning("delayq beat: entry %r names task %r, which this app has not "
                        "registered; installing it anyway", spec.name, spec.task)

    def route(self, spec: EntrySpec) -> Route:
        """Resolve the queue as Celery's router would (options, task_routes, default queue)."""
        options = {k: v for k, v in spec.options.items()
                   if k in ("queue", "exchange", "routing_key", "priority")}
        try:
            routed = self.app.amqp.router.route(options, spec.task, spec.args, spec.kwargs)
        except QueueNotFound as exc:
            raise InvalidInput(f"beat entry {spec.name!r}: {exc}") from exc
        queue = routed.get("queue")
        name = getattr(queue, "name", None) or self.app.conf.task_default_queue \
            or messages.DEFAULT_QUEUE
        exchange = routed.get("exchange") or getattr(queue, "exchange", None) or ""
        if isinstance(exchange, Exchange):
            exchange = exchange.name
        routing_key = routed.get("routing_key") or getattr(queue, "routing_key", None) or name
        priority = routed.get("priority", self.app.conf.task_default_priority)
        return Route(name, str(exchange or ""), routing_key, priority)
