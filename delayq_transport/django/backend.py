"""Django's task framework (``django.tasks``, Django 6) on delayq: a production backend,
imported by its users as ``delayq_transport.django.tasks`` (which stays importable on older
Django: Celery's Django fixup imports every app's ``tasks`` module).

``TASKS = {"default": {"BACKEND": "delayq_transport.django.tasks.DelayqBackend"}}`` and
``manage.py delayq_worker`` (:mod:`.worker`). A thin front end on the core:

* **enqueue** is the core's one publish path (:meth:`DelayedQueue.offer`): one row per task in
  the queue table, its key the result id, its kind ``django:<queue>:<priority>``, its payload
  the task's JSON, due at ``run_after`` (to the millisecond) or now. Inside ``atomic()`` on the
  backend's database the row is written in that transaction (core ``transaction()``, as
  ``DELAYQ_JOIN_ATOMIC`` does for Celery): a worker sees it once the block commits, never if it
  rolls back. Outside ``atomic()`` it commits at once. On by default (``JOIN_ATOMIC``).
* **results** (core/task_results.py): a worker records each attempt (RUNNING, then SUCCESSFUL,
  FAILED, or READY again while a retry waits or after it was interrupted) in
  ``delayq_task_results``; ``get_result`` reads that row and the task's queue row in one
  statement, from any process, and shows a RUNNING result that nothing runs any more as READY
  with the interruption in ``errors`` (:mod:`.attempts`). Results that finished longer ago
  than ``RESULT_RETENTION`` are pruned by the workers.
* **priority** −100..100: one kind per (queue, priority); a worker polls all its kinds in one
  statement, highest priority first across its queues.

OPTIONS (all optional) are declared once, in :data:`.options.TASK_OPTIONS`, and read through
it, never converted: an unknown name or a value of the wrong type or range is a system check
error (``delayq.E007``, :mod:`.checks`), and enqueue, get_result and a worker raise
``ImproperlyConfigured`` naming the option, the value and what it expects. So does a
``DATABASE`` that is not a PostgreSQL alias of ``DATABASES``. Their reference, rendered from
that registry: docs/reference/django-tasks-options.md.

Needs Django 6 (``django.tasks``, Python >= 3.12) or, on Django 4.2 to 5.2, the
``django-tasks`` backport (``django_tasks``): :mod:`._framework` picks the one this project has
and is where the two differ.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from ..core import (
    Database,
    DelayedQueue,
    StoredResult,
    TaskResults,
    detached,
    transaction,
)
from ..formats.django_tasks import (
    KIND_PREFIX,
    MAX_QUEUE_NAME,
    kind_of,
    kinds_for,
    result_truth,
)
from . import database_url
from ._framework import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from .checks import backend_checks, database_error
from .options import TASK_OPTIONS

__all__ = ["KIND_PREFIX", "DelayqBackend", "kind_of", "kinds_for", "retry", "task_backends"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def retry(retries: int, *, backoff: float | None = None) -> Callable[[F], F]:
    """A task's own retry policy, under ``@task`` (Django 6.0's ``task()`` takes no options of
    a backend's; the backport's passes them to ``task_class``, but one decorator serves both)::

        @task()
        @retry(3, backoff=2.0)
        def charge(order_id): ...

    ``retries``: how many more times a failed task runs; ``backoff``: seconds before the first
    retry, doubled each time (default: the backend's ``BACKOFF``)."""
    # The backend's RETRIES and BACKOFF checks: a per-task policy is refused as the
    # backend's would be (InvalidInput is a ValueError), never converted.
    retries = TASK_OPTIONS.checked("RETRIES", retries, "@retry", "retries")
    if backoff is not None:
        backoff = TASK_OPTIONS.checked("BACKOFF", backoff, "@retry", "backoff")

    def mark(func: F) -> F:
        func.delayq_retries = retries  # type: ignore[attr-defined]
        func.delayq_backoff = backoff  # type: ignore[attr-defined]
        return func

    return mark


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def aware(at: datetime) -> datetime:
    """A naive datetime (``USE_TZ = False``) is in the current time zone, as Django has it."""
    return timezone.make_aware(at) if timezone.is_naive(at) else at


def to_ms(at: datetime) -> int:
    # Exact: int(timestamp() * 1000) truncates 2.156 s to 2155 ms.
    return (aware(at) - EPOCH) // timedelta(milliseconds=1)


def to_us(at: datetime) -> int:
    return (aware(at) - EPOCH) // timedelta(microseconds=1)


def from_us(us: int | None) -> datetime | None:
    if us is None:
        return None
    at = EPOCH + timedelta(microseconds=us)
    return at if settings.USE_TZ else timezone.make_naive(at)


def from_ms(ms: int | None) -> datetime | None:
    if ms is None:
        return None
    at = EPOCH + timedelta(milliseconds=ms)
    return at if settings.USE_TZ else timezone.make_naive(at)


def now_ms() -> int:
    return to_ms(timezone.now())


# -- the process' store: one pool per database and table, whatever the thread ------------------

@dataclass
class Store:
    """What every backend instance of a process shares for one (database, table): Django makes
    a backend per thread, a pool each would multiply connections."""

    db: Database
    queue: DelayedQueue
    results: TaskResults
    pid: int
    _kinds: dict[str, DelayedQueue]

    def queue_for(self, kind: str) -> DelayedQueue:
        q = self._kinds.get(kind)
        if q is None:
            q = self._kinds[kind] = self.queue.with_kind(kind)
        return q

    def close(self) -> None:
        self.queue.close()
        self.db.close()


_STORES: dict[tuple[str, str], Store] = {}
_STORES_LOCK = threading.Lock()


def store_for(url: str, table: str, pool_size: int) -> Store:
    """The process' store for this database and table (a forked child makes its own)."""
    key = (url, table)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is not None and store.pid == os.getpid():
            return store
        db = Database(url, min_size=0, max_size=pool_size)
        try:
            queue = DelayedQueue(db, kind=kind_of("default", 0), table=table,
                                 ensure_schema=False)
        except BaseException:
            db.close()
            raise
        store = _STORES[key] = Store(db, queue, TaskResults(queue, KIND_PREFIX), os.getpid(), {})
        return store


def close_stores() -> None:
    """Close every pool of this process (tests, and a worker on its way out)."""
    with _STORES_LOCK:
        stores = [s for s in _STORES.values() if s.pid == os.getpid()]
        _STORES.clear()
    for store in stores:
        store.close()


# -- payloads ---------------------------------------------------------------------------------

def storable(value: Any) -> Any:
    """``value`` (normalised JSON) if PostgreSQL's jsonb can hold it: not a NUL character in a
    string (JSON can, jsonb cannot), else ValueError."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("a string holds a NUL character, which PostgreSQL (jsonb) cannot "
                             "store")
    elif isinstance(value, dict):
        for k, v in value.items():
            storable(k)
            storable(v)
    elif isinstance(value, list):
        for v in value:
            storable(v)
    return value


def encode(result: TaskResult) -> bytes:
    """The queue row's payload: what a worker needs to rebuild the task and its result."""
    task = result.task
    return json.dumps({
        "task": task.module_path,
        "args": storable(result.args),
        "kwargs": storable(result.kwargs),
        "backend": result.backend,
        "queue": task.queue_name,
        "priority": task.priority,
        # Microseconds: the result read back equals the one enqueue returned (the row's
        # scheduledAt has it in milliseconds).
        "run_after_us": None if task.run_after is None else to_us(task.run_after),
        "enqueued_at": None if result.enqueued_at is None else to_ms(result.enqueued_at),
    }, separators=(",", ":"), allow_nan=False).encode()


def task_of(data: dict[str, Any]) -> Task:
    """The enqueued task, with the queue, priority, run_after and backend it was enqueued with."""
    task = import_string(data["task"])
    if not isinstance(task, Task):
        raise InvalidTask(f"{data['task']!r} is not a task (decorate it with @task)")
    run_after = from_us(data.get("run_after_us"))
    return task.using(priority=data["priority"], queue_name=data["queue"],
                      run_after=run_after, backend=data["backend"])


def errors_of(stored: list[dict[str, str]]) -> list[TaskError]:
    return [TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
            for e in stored]


def result_of(key: str, stored: StoredResult) -> TaskResult:
    """A ``TaskResult`` from what the database holds about a task: READY with the
    interruption in ``errors`` while nothing runs a RUNNING one (``result_truth``)."""
    data = stored.task
    shown, errors = result_truth(stored)
    status = TaskResultStatus(shown) if shown else TaskResultStatus.READY
    result = TaskResult(
        task=task_of(data), id=key, status=status,
        enqueued_at=from_ms(data.get("enqueued_at") if stored.enqueued_at_ms is None
                            else stored.enqueued_at_ms),
        started_at=from_ms(stored.started_at_ms),
        finished_at=from_ms(stored.finished_at_ms),
        last_attempted_at=from_ms(stored.last_attempted_at_ms),
        args=data["args"], kwargs=data["kwargs"], backend=data["backend"],
        errors=errors_of(errors), worker_ids=list(stored.worker_ids),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", stored.return_value)
    return result


# -- the backend ----------------------------------------------------------------------------

class DelayqBackend(BaseTaskBackend):
    """``django.tasks`` on delayq (see the module docstring for its OPTIONS)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}] OPTIONS"
        #: What OPTIONS holds that is refused (an unknown name, a value of the wrong type or
        #: range), one sentence each; [] when nothing is. A refused backend is still made:
        #: Django makes every backend to ask for its checks, which report these
        #: (``delayq.E007``) rather than a traceback. It does nothing with a guessed setting:
        #: enqueue, get_result and a worker raise ImproperlyConfigured (:meth:`usable`), since
        #: production processes (gunicorn, a worker) run no checks.
        self.option_problems: list[str] = TASK_OPTIONS.problems(self.options, where)
        # Refused: the defaults, only so that the attributes exist; nothing runs on them.
        options = TASK_OPTIONS.parse({} if self.option_problems else self.options, where)
        self.database: str = options["DATABASE"]
        self.table: str = options["TABLE"]
        self.join_atomic: bool = options["JOIN_ATOMIC"]
        self.retries: int = options["RETRIES"]
        self.backoff: float = options["BACKOFF"]
        self.max_backoff: float = options["MAX_BACKOFF"]
        self.lease: float = options["LEASE"]
        self.result_retention: float | None = options["RESULT_RETENTION"]
        self.polling_interval: float = options["POLLING_INTERVAL"]
        self.dead_letter_retention: float = options["DEAD_LETTER_RETENTION"]
        self.schema_wait: float = options["SCHEMA_WAIT"]
        self.pool_size: int = options["POOL_SIZE"]
        #: Periodic tasks (delayq_transport/django/periodic.py), installed by the workers.
        self.periodic: dict[str, Any] = dict(options["PERIODIC"])
        #: ``settings`` | ``admin`` | ``both`` (delayq_transport/django/periodic_admin.py).
        self.periodic_source: str = options["PERIODIC_SOURCE"]
        self.periodic_refresh: float = options["PERIODIC_REFRESH"]

    @property
    def schedules(self) -> bool:
        """Whether its workers run a periodic scheduler (entries declared, or admin mode)."""
        return bool(self.periodic) or self.periodic_source != "settings"

    # -- the store -------------------------------------------------------------------------

    def usable(self) -> None:
        """Raise ImproperlyConfigured when OPTIONS were refused or ``DATABASE`` is not a
        PostgreSQL alias of ``DATABASES`` (what ``delayq.E007``/``E001``/``E002`` report)."""
        if self.option_problems:
            raise ImproperlyConfigured("; ".join(self.option_problems))
        error = database_error(f"TASKS[{self.alias!r}]", self.database)
        if error is not None:
            raise ImproperlyConfigured(f"{error.msg}; {error.hint}")

    def url(self) -> str:
        self.usable()
        return database_url(self.database)

    def store(self) -> Store:
        return store_for(self.url(), self.table, self.pool_size)

    def queue_names(self) -> list[str]:
        """The queues a worker takes by default: ``QUEUES`` (sorted), or ``default``."""
        return sorted(self.queues) or ["default"]

    # -- the contract ----------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if len(task.queue_name) > MAX_QUEUE_NAME:
            raise InvalidTask(f"queue name {task.queue_name[:40]!r}... is longer than "
                              f"{MAX_QUEUE_NAME} characters")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.usable()
        self.validate_task(task)
        result = TaskResult(
            task=task, id=str(uuid.uuid4()), status=TaskResultStatus.READY,
            # Whole milliseconds, as stored: get_result() then returns an equal result.
            enqueued_at=from_ms(now_ms()), started_at=None, last_attempted_at=None,
            finished_at=None, args=args, kwargs=kwargs, backend=self.alias, errors=[],
            worker_ids=[],
        )
        payload = encode(result)  # args/kwargs as JSON (TaskResult normalised them)
        queue = self.store().queue_for(kind_of(task.queue_name, task.priority))
        run_after = None if task.run_after is None else aware(task.run_after)
        connection = connections[self.database]
        if not self.join_atomic:
            with detached():  # even where DELAYQ_JOIN_ATOMIC would join
                queue.offer(result.id, payload, run_after, can_update=False)
        elif connection.in_atomic_block:
            with transaction(connection):
                queue.offer(result.id, payload, run_after, can_update=False)
        else:
            queue.offer(result.id, payload, run_after, can_update=False)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: Any) -> TaskResult:
        key = str(result_id)
        stored = self.store().results.get(key) if key else None
        if stored is None:
            raise TaskResultDoesNotExist(key)
        return result_of(key, stored)

    # -- retries ---------------------------------------------------------------------------

    def retries_of(self, task: Task) -> int:
        own = getattr(task.func, "delayq_retries", None)
        return self.retries if own is None else int(own)

    def backoff_s(self, task: Task, attempts: int) -> float:
        """Seconds before the retry that follows attempt number ``attempts`` (1-based)."""
        own = getattr(task.func, "delayq_backoff", None)
        base = self.backoff if own is None else float(own)
        return min(base * 2 ** max(attempts - 1, 0), self.max_backoff)

    # -- checks (delayq_transport/django/checks.py) ------------------------------------------

    def check(self, **kwargs: Any) -> Iterator[checks.CheckMessage]:
        yield from super().check(**kwargs)
        yield from backend_checks(self)

    def database_handle(self) -> Database:
        """The process' pool on the backend's database (what the checks read through)."""
        return self.store().db
