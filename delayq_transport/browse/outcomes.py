"""Celery outcomes from the app's result backend: what happened to a task after its row left.

delayq's table holds a task until a worker takes it; its outcome (success, failure, the
exception and traceback, a retry's reason) is what Celery writes to the *result backend*. The
web page reads it from there when it is told where that is (``delayq web --result-backend
URL``, the URL of the app's ``result_backend``): nothing is recorded twice, and a worker pays
nothing more per task than Celery itself does.

Reads are bounded in time: the backend's connection and socket timeouts are short, and a
backend that does not answer makes the page say so instead of hanging.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..core import DelayedQueue, InvalidInput, TaskResults
from ..formats.decoders import HIDDEN
from ..formats.django_tasks import KIND_PREFIX, result_truth

#: Seconds a result-backend read may take before the page gives up on it.
BACKEND_TIMEOUT_S = 2.0
#: Final states: Celery's, and Django's task framework's (its results are delayq's own).
READY_STATES = ("SUCCESS", "FAILURE", "REVOKED", "SUCCESSFUL", "FAILED")
#: States whose ``result`` is the exception (the page labels it so).
FAILED_STATES = ("FAILURE", "RETRY", "FAILED")


@dataclass
class Outcome:
    task_id: str
    state: str
    result: Any
    traceback: str | None
    date_done: str | None
    retries: int | None
    name: str | None
    error: str | None = None  # the backend could not be read
    #: Where it was read: the app's result backend, or delayq's own task results (a task of
    #: Django's task framework, written by ``manage.py delayq_worker``).
    source: str = "result backend"

    @property
    def ready(self) -> bool:
        return self.state in READY_STATES

    def as_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "state": self.state, "result": self.result,
                "traceback": self.traceback, "date_done": self.date_done,
                "retries": self.retries, "task": self.name, "ready": self.ready,
                "error": self.error, "source": self.source}


def task_result_outcome(queue: DelayedQueue, task_id: str, *, hide_results: bool = False
                        ) -> Outcome | None:
    """The outcome of a task of Django's task framework, from delayq's task results (None:
    no worker started it, or it is not such a task). ``retries``: attempts after the first;
    a failure's ``result`` is its exception class, its traceback the last attempt's."""
    if not task_id or len(task_id) > 200:
        return None
    stored = TaskResults(queue, KIND_PREFIX).get(task_id)
    if stored is None or stored.status is None:
        return None
    status, errors = result_truth(stored)  # READY, interrupted, while nothing runs it
    last = errors[-1] if errors else None
    if status == "SUCCESSFUL":
        result: Any = HIDDEN if hide_results else stored.return_value
    else:
        result = last["exception_class_path"] if last else None
    done = stored.finished_at_ms
    return Outcome(task_id, str(status), result, last["traceback"] if last else None,
                   None if done is None else _iso_ms(done), max(len(stored.worker_ids) - 1, 0),
                   str(stored.task.get("task")), source="delayq")


def _iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _jsonable(value: Any) -> Any:
    """A result as JSON can show it: itself, or its repr (exceptions, custom objects)."""
    if isinstance(value, BaseException):
        return f"{type(value).__name__}({', '.join(repr(a) for a in value.args)})"
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


class ResultBackend:
    """Celery's result backend at ``url``, read through a Celery app of its own (no tasks, no
    broker connection: only ``AsyncResult(task_id).state/result/traceback``)."""

    def __init__(self, url: str, *, hide_results: bool = False) -> None:
        try:
            from celery import Celery
        except ImportError as exc:  # pragma: no cover - celery is a dependency
            raise InvalidInput("reading outcomes needs Celery installed") from exc
        self.url = url
        self.hide_results = hide_results
        self.app = Celery("delayq-web-outcomes", backend=url, set_as_current=False)
        self.app.conf.update(
            redis_socket_timeout=BACKEND_TIMEOUT_S, redis_socket_connect_timeout=BACKEND_TIMEOUT_S,
            redis_retry_on_timeout=False, result_backend_always_retry=False,
        )
        self._lock = threading.Lock()

    @property
    def shown_url(self) -> str:
        from ..core.db import mask_password

        return mask_password(self.url)

    def outcome(self, task_id: str) -> Outcome:
        """What the backend knows of ``task_id`` (state PENDING: nothing stored yet, or
        unknown: Celery cannot tell a task not run yet from one never sent)."""
        if not task_id or len(task_id) > 200:
            raise InvalidInput("give a task id (1-200 characters)")
        try:
            with self._lock:  # one backend client, not thread-safe for every backend
                meta = self.app.AsyncResult(task_id).backend.get_task_meta(task_id)
        except Exception as exc:  # noqa: BLE001 - any backend error is shown, not raised
            return Outcome(task_id, "UNKNOWN", None, None, None, None, None,
                           error=f"result backend {self.shown_url} did not answer: {exc}")
        result = meta.get("result")
        hidden = self.hide_results and meta.get("status") == "SUCCESS"
        done = meta.get("date_done")
        return Outcome(task_id, str(meta.get("status") or "PENDING"),
                       HIDDEN if hidden else _jsonable(result), meta.get("traceback"),
                       None if done is None else str(done), meta.get("retries"),
                       meta.get("name"))


def finished_outcome(queue: DelayedQueue, task_id: str, backend_url: str | None = None,
                     hide_results: bool = False) -> Outcome | None:
    """The outcome of a task no longer in the queue: delayq's own result (django.tasks), else
    the Celery result backend's at ``backend_url`` (read only); None when neither knows it (a
    result backend cannot tell an unknown id from a pending one: PENDING is None here)."""
    if not task_id or task_id.lstrip("#").isdigit():
        return None  # a row id: rows have no outcome once gone
    own = task_result_outcome(queue, task_id, hide_results=hide_results)
    if own is not None or not backend_url:
        return own
    found = ResultBackend(backend_url, hide_results=hide_results).outcome(task_id)
    return None if found.state == "PENDING" and found.error is None else found
