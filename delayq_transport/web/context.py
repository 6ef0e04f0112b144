"""What every route module of ``delayq web`` shares: the app's :class:`State` (the service, the
queue, the security options, the templates), rendering, and the guard of state changes.

Below the route modules (pages, api, bulk, outcomes, workers) and the app that assembles them,
so none of them imports the app or another route module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from importlib.resources import files
from typing import Any, TypeVar

from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.templating import Jinja2Templates

from ..browse import TaskInFlight, TaskNotFound, TaskService
from ..browse.deadletters import DeadLetterService
from ..browse.failures import FailureService
from ..browse.outcomes import Outcome, ResultBackend, task_result_outcome
from ..core import InvalidInput
from ..core.queue import DelayedQueue
from .jobs import BulkJobs
from .security import WebConfig, csrf_ok

HERE = files("delayq_transport.web")
#: How route modules wrap their state-changing handlers (:func:`guarded`).
Guard = Callable[[Callable[[Request, dict[str, str]], Awaitable[Response]]],
                 Callable[[Request], Awaitable[Response]]]

T = TypeVar("T")
HERE = files("delayq_transport.web")


class State:
    """What every handler needs: the service, the queue and the security options."""

    def __init__(self, queue: DelayedQueue, config: WebConfig) -> None:
        self.queue = queue
        self.config = config
        self.service = TaskService(queue, hide_args=config.hide_args)
        self.templates = Jinja2Templates(directory=str(HERE.joinpath("templates")))
        self.templates.env.globals.update(config=config)
        self.templates.env.filters["when"] = when
        #: Bulk actions on large selections, running in this process (:mod:`.jobs`).
        self.bulk_jobs = BulkJobs()
        self._dead_letters: DeadLetterService | None = None
        self._failures: FailureService | None = None
        self._result_backend: ResultBackend | None = None

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await run_in_threadpool(partial(fn, *args, **kwargs))

    def dead_letters(self) -> DeadLetterService:
        """Every front end's dead letters (made on first use, kept with the app's state)."""
        if self._dead_letters is None:
            self._dead_letters = DeadLetterService(self.queue, hide_args=self.config.hide_args)
        return self._dead_letters

    def failures(self) -> FailureService:
        """Failed tasks of every front end (made on first use, kept with the app's state)."""
        if self._failures is None:
            self._failures = FailureService(self.queue, hide_args=self.config.hide_args)
        return self._failures

    def result_backend(self) -> ResultBackend | None:
        """The app's result backend when ``--result-backend`` named one (made on first use)."""
        url = self.config.result_backend
        if not url:
            return None
        if self._result_backend is None:
            self._result_backend = ResultBackend(url, hide_results=self.config.hide_args)
        return self._result_backend


def when(iso: str | None, relative: bool = True) -> Markup | str:
    """A time as ``<time datetime=ISO>`` (UTC text): app.js shows it in the viewer's zone or
    UTC, with a relative form, so the server stays zone-free."""
    if not iso:
        return "–"
    rel = "" if relative else ' data-rel="no"'
    return Markup('<time datetime="{}"{}>{} UTC</time>').format(iso, Markup(rel),
                                                             str(iso)[:19].replace("T", " "))


def state(request: Request) -> State:
    return request.app.state.delayq  # type: ignore[no-any-return]


def status_of(exc: Exception) -> int:
    if isinstance(exc, TaskNotFound):
        return 404
    if isinstance(exc, TaskInFlight):
        return 409
    return 400 if isinstance(exc, InvalidInput) else 500


async def form_or_json(request: Request) -> dict[str, str]:
    """The body of a state change, as a form (pages) or JSON (API clients)."""
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            data = await request.json()
        except ValueError as exc:
            raise InvalidInput("request body is not valid JSON") from exc
        if not isinstance(data, dict):
            raise InvalidInput("request body must be a JSON object")
        return {str(k): str(v) for k, v in data.items() if v is not None}
    form = await request.form()
    return {k: v for k, v in form.items() if isinstance(v, str)}


def guarded(handler: Callable[[Request, dict[str, str]], Awaitable[Response]]
            ) -> Callable[[Request], Awaitable[Response]]:
    """State changes: refused in read-only mode and without a valid CSRF token."""

    async def endpoint(request: Request) -> Response:
        cfg = state(request).config
        if cfg.read_only:
            return refuse(request, 403, "read-only mode: changes are disabled")
        try:
            body = await form_or_json(request)
        except InvalidInput as exc:
            return refuse(request, 400, str(exc))
        if not csrf_ok(request, cfg, body.get("csrf_token")):
            return refuse(request, 403, "missing or invalid CSRF token")
        return await handler(request, body)

    return endpoint


def refuse(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    return PlainTextResponse(message, status_code=status)


def render(request: Request, name: str, **context: Any) -> Response:
    st = state(request)
    context.setdefault("msg", request.query_params.get("msg"))
    return st.templates.TemplateResponse(request, name, context)


async def outcome_of(request: Request, task_id: str) -> Outcome | None:
    """The task's outcome for the task page: delayq's own record of a task of Django's task
    framework, else the app's result backend's; None: neither has one."""
    st = state(request)
    own = await st.call(task_result_outcome, st.queue, task_id,
                        hide_results=st.config.hide_args)
    if own is not None:
        return own
    backend = st.result_backend()
    return None if backend is None else await st.call(backend.outcome, task_id)
