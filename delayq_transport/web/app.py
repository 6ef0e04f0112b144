"""The ASGI app of ``delayq web``: Starlette routes over :class:`TaskService`, Jinja2 pages,
static assets from the package (no CDN: the page works offline).

Requests run the (blocking) service in Starlette's thread pool; the service bounds every query,
so a request costs the same on a 5M-row table as on an empty one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from importlib.resources import files
from typing import Any, TypeVar

from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.errors import DelayqError, InvalidInput
from ..core.queue import DelayedQueue
from ..tasks import TaskInFlight, TaskNotFound, TaskService
from .security import WebConfig, authenticated, csrf_ok

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

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await run_in_threadpool(partial(fn, *args, **kwargs))


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
            return _refuse(request, 403, "read-only mode: changes are disabled")
        try:
            body = await form_or_json(request)
        except InvalidInput as exc:
            return _refuse(request, 400, str(exc))
        if not csrf_ok(request, cfg, body.get("csrf_token")):
            return _refuse(request, 403, "missing or invalid CSRF token")
        return await handler(request, body)

    return endpoint


def _refuse(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    return PlainTextResponse(message, status_code=status)


class AuthMiddleware:
    """Credentials on every request when configured (pure ASGI: no body buffering)."""

    def __init__(self, app: ASGIApp, config: WebConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not authenticated(Request(scope), self.config):
            response = PlainTextResponse(
                "authentication required", status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="delayq", charset="UTF-8"'})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; "
                                 b"frame-ancestors 'none'; form-action 'self'"),
]


class SecurityHeaders:
    """No framing (clickjacking on the action buttons), no inline scripts, no sniffing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)


def create_app(queue: DelayedQueue, config: WebConfig | None = None) -> Starlette:
    """The app for one queue table; the caller owns ``queue`` (and closes it)."""
    from . import api, bulk, outcomes, pages, workers

    config = (config or WebConfig()).validate()
    routes = [
        *bulk.routes(guarded), *pages.routes(guarded), *api.routes(guarded),
        *outcomes.routes(guarded), *workers.routes(guarded),
        Mount("/static", StaticFiles(directory=str(HERE.joinpath("static"))), name="static"),
    ]
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=config.allowed_hosts()),
        Middleware(AuthMiddleware, config=config),
    ]
    handlers: dict[Any, Any] = {DelayqError: _delayq_error}
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=handlers)
    app.state.delayq = State(queue, config)
    return app


async def _delayq_error(request: Request, exc: Exception) -> Response:
    status = status_of(exc)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": str(exc)}, status_code=status)
    st = state(request)
    return st.templates.TemplateResponse(request, "error.html",
                                         {"message": str(exc), "status": status},
                                         status_code=status)
