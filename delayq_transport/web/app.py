"""The ASGI app of ``delayq web``: Starlette routes over :class:`~..tasks.TaskService`, Jinja2
pages, static assets from the package (no CDN: the page works offline). It assembles the route
modules (which share :mod:`.context`) with the security middleware.

Requests run the (blocking) service in Starlette's thread pool; the service bounds every query,
so a request costs the same on a 5M-row table as on an empty one.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core import DelayqError
from ..core.queue import DelayedQueue
from . import api, bulk, controls, failures, outcomes, pages, workers
from .context import HERE, State, guarded, state, status_of
from .security import WebConfig, authenticated


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
    config = (config or WebConfig()).validate()
    routes = [
        *bulk.routes(guarded), *pages.routes(guarded), *api.routes(guarded),
        *outcomes.routes(guarded), *workers.routes(guarded), *failures.routes(guarded),
        *controls.routes(guarded),
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
