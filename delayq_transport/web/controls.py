"""The queues page and its API: paused and limited queues with what they hold now, and the
forms that pause, resume and limit one (docs/how-to/limits.md); state changes are guarded
(CSRF, read-only mode) like every other."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..browse.controls import QueueControls, limit_changes
from ..core import InvalidInput
from .context import Guard, render, state


def _rows(controls: QueueControls) -> list[dict[str, Any]]:
    return [v.as_dict() for v in controls.list()]


async def queues_page(request: Request) -> Response:
    st = state(request)
    rows = await st.call(_rows, QueueControls(st.queue))
    return render(request, "queues.html", controls=rows, page="queues")


async def queues_api(request: Request) -> Response:
    st = state(request)
    return JSONResponse({"controls": await st.call(_rows, QueueControls(st.queue))})


async def change(request: Request, body: dict[str, str]) -> Response:
    """POST /queues/{action} (pause, resume, limit) with the queue's ``name`` in the body
    (a name may hold ``/`` or ``:``); the API answers JSON, the page redirects back."""
    st = state(request)
    action, name = request.path_params["action"], str(body.get("name", "")).strip()
    controls = QueueControls(st.queue)
    if action == "pause":
        control = await st.call(controls.pause, name)
    elif action == "resume":
        control = await st.call(controls.resume, name)
    elif action == "limit":
        control = await st.call(controls.limit, name, **limit_changes(body))
    else:
        raise InvalidInput("action must be pause, resume or limit")
    if request.url.path.startswith("/api/"):
        return JSONResponse({"queue": control.name, "paused": control.paused,
                             "concurrency": control.concurrency,
                             "key_concurrency": control.key_concurrency})
    msg = f"queue {control.name!r}: {action}d" if action != "limit" else (
        f"queue {control.name!r}: limits set")
    return RedirectResponse(f"/queues?{urlencode({'msg': msg})}", status_code=303)


def routes(guard: Guard) -> list[Route]:
    return [
        Route("/queues", queues_page),
        Route("/queues/{action}", guard(change), methods=["POST"]),
        Route("/api/queues", queues_api),
        Route("/api/queues/{action}", guard(change), methods=["POST"]),
    ]
