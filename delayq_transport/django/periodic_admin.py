"""Periodic tasks of django.tasks edited in the Django admin: django-celery-beat's tables read
as a source of entries (``OPTIONS["PERIODIC_SOURCE"] = "admin"`` or ``"both"``), the way a
Celery beat in admin mode reads them (:class:`~delayq_transport.scheduling.djbeat.DjangoBeatSource`:
the core's named statements, re-read when ``PeriodicTasks.last_update`` moved).

Which rows are django.tasks': a row whose ``task`` imports (``import_string``) to a
``django.tasks.Task`` of this backend. A team may keep Celery tasks in the same table (a Celery
beat in admin mode runs those): a row whose name does not import, or imports to something that
is not a ``Task`` (a Celery task, a plain function), is skipped, logged once per change as a
warning naming it and why, and listed by ``check()``; it is never installed here. A django.tasks
row another backend runs (its task's ``backend``) is that backend's scheduler's to install.

Field by field, as :func:`~delayq_transport.scheduling.djbeat.carried` reads a row (interval,
crontab in its ``timezone``, solar, clocked; ``start_time``, ``expires`` as the entry's end,
``one_off``, ``enabled``, ``args`` and ``kwargs`` JSON), then for django.tasks: ``queue`` is the
``queue_name`` and ``priority`` the priority (else the task's), both validated by the backend;
``headers`` may carry delayq's ``delayq_misfire`` and ``delayq_grace`` (the entry's misfire
policy and grace; default ``coalesce`` and 60 s). What django.tasks has no notion of refuses the
row, with the reason, rather than being ignored: ``exchange``, ``routing_key`` (Celery routing),
``expire_seconds`` (a message expiry) and any other header.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from ..core import DelayedQueue, InvalidInput
from ..core.integrations import prune_run_claims
from ..scheduling.carried import Carried, Refused
from ..scheduling.djbeat import SOURCE, DjangoBeatSource
from ..scheduling.entries import DEFAULT_GRACE_S, DEFAULT_MISFIRE, EntrySpec, make_spec
from ._framework import Task
from .options import TASK_OPTIONS

log = logging.getLogger("delayq_transport.django.periodic")

DEFAULT_SOURCE = TASK_OPTIONS.default("PERIODIC_SOURCE")
#: The ``headers`` keys an admin row may set (django.tasks messages have no headers).
HEADER_OPTIONS = ("delayq_misfire", "delayq_grace")
#: Old claims of occurrences written to run history are pruned every this many refreshes.
PRUNE_EVERY = 60


def periodic_source(value: object) -> str:
    """``OPTIONS["PERIODIC_SOURCE"]`` through the registry's own check (None: the default), for
    callers that build a :class:`~.periodic.Scheduler` without a backend."""
    if value is None:
        return str(DEFAULT_SOURCE)
    return str(TASK_OPTIONS.checked("PERIODIC_SOURCE", value, "OPTIONS"))


@dataclass(frozen=True)
class Skipped:
    """A row this backend does not install: ``reason`` says why (``foreign``: a django.tasks
    task of another backend, which is that backend's to install, not worth a warning)."""

    name: str
    task: str
    reason: str
    foreign: bool = False

    def __str__(self) -> str:
        return (f"django-celery-beat periodic task {self.name!r} (task {self.task!r}) is not "
                f"installed by django.tasks: {self.reason}")


def django_task(path: str) -> Task | str:
    """The django.tasks task a row's ``task`` names, or why it names none."""
    try:
        found = import_string(path)
        is_task = isinstance(found, Task)  # a lazy proxy (Celery's) may raise here
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever the module raised
        return f"it cannot be imported ({type(exc).__name__}: {exc})"
    if not is_task:
        kind = f"{type(found).__module__}.{type(found).__qualname__}"
        return (f"it is a {kind}, not a django.tasks task (a Celery task is a Celery beat's "
                "to run)")
    return found


def admin_spec(entry: Carried, task: Task) -> EntrySpec:
    """A carried row as an entry of this backend; :class:`Refused` names what does not fit."""
    name, opts = entry.name, entry.options
    for key in ("exchange", "routing_key"):
        if key in opts:
            raise Refused(name, f"{key} {opts[key]!r} is Celery routing; a django.tasks task "
                                "goes to its queue (set queue, clear " + key + ")")
    if "expires" in opts and "delayq_expires" not in opts:
        raise Refused(name, "expire_seconds: a django.tasks task does not expire (clear it; "
                            "expires ends the periodic task)")
    headers: Mapping[str, Any] = opts.get("headers") or {}
    unknown = sorted(set(headers) - set(HEADER_OPTIONS))
    if unknown:
        raise Refused(name, f"headers {unknown}: a django.tasks task has no headers (delayq "
                            f"reads {', '.join(HEADER_OPTIONS)} there)")
    queue_name = str(opts.get("queue") or task.queue_name)
    priority = int(opts["priority"]) if "priority" in opts else task.priority
    try:
        task.using(queue_name=queue_name, priority=priority)  # the backend's own validation
    except Exception as exc:  # noqa: BLE001 - InvalidTask, ValueError: the row's reason
        raise Refused(name, f"queue {queue_name!r}, priority {priority}: {exc}") from exc
    options: dict[str, Any] = {k: v for k, v in opts.items() if k.startswith("delayq_")}
    options.update({"queue": queue_name, "priority": priority, "backend": task.backend,
                    "delayq_misfire": headers.get("delayq_misfire", DEFAULT_MISFIRE),
                    "delayq_grace": headers.get("delayq_grace", DEFAULT_GRACE_S)})
    try:
        return make_spec(name, task.module_path, entry.schedule, entry.args, entry.kwargs,
                         options, source=SOURCE)
    except InvalidInput as exc:
        raise Refused(name, str(exc).removeprefix(f"beat entry {name!r}: ")) from exc


def classify(source: DjangoBeatSource, alias: str
             ) -> tuple[dict[str, EntrySpec | Exception], dict[str, Skipped]]:
    """The enabled rows of ``source``: this backend's (an entry, or the error refusing it) and
    the rest (skipped, with the reason)."""
    ours: dict[str, EntrySpec | Exception] = {}
    skipped: dict[str, Skipped] = {}
    for name, entry in source.entries().items():
        path = source.tasks.get(name, entry.task if isinstance(entry, Carried) else "")
        task = django_task(path)
        if isinstance(task, str):
            skipped[name] = Skipped(name, path, task)
        elif task.backend != alias:
            skipped[name] = Skipped(name, path, f"its task runs on backend {task.backend!r}",
                                    foreign=True)
        elif isinstance(entry, Exception):
            ours[name] = entry
        else:
            try:
                ours[name] = admin_spec(entry, task)
            except Refused as exc:
                ours[name] = exc
    return ours, skipped


class AdminEntries:
    """A scheduler's view of django-celery-beat's tables: the entries of this backend at every
    refresh, re-read when the change mark moved; each skipped row logged once per change."""

    def __init__(self, queue: DelayedQueue, alias: str) -> None:
        self.queue = queue
        self.alias = alias
        self.source = DjangoBeatSource(queue.db, queue.table)
        self.skipped: dict[str, Skipped] = {}
        self._refreshes = 0

    def specs(self) -> dict[str, EntrySpec | Exception]:
        ours, skipped = classify(self.source, self.alias)
        for name, row in sorted(skipped.items()):
            if self.skipped.get(name) != row:
                (log.info if row.foreign else log.warning)("delayq periodic tasks: %s", row)
        self.skipped = skipped
        self._refreshes += 1
        if self._refreshes % PRUNE_EVERY == 1:
            prune_run_claims(self.queue.db, self.queue.queries)
        return ours
