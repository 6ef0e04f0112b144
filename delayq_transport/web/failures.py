"""Failed and retrying tasks: the page (``/failed``) with retry and discard, and its JSON API,
over :class:`~..tasks.failures.FailureService` (what ``delayq tasks list --state
failed|retrying``, ``retry`` and ``discard`` use)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..browse import TaskFilter, decode_cursor, encode_cursor
from ..browse.failures import Done
from ..browse.filters import page_size
from ..core import InvalidInput
from .context import Guard, render, state

#: The page's two lists.
LISTS = ("failed", "retrying")


def _params(request: Request) -> tuple[str, str | None, str | None, int]:
    params = request.query_params
    which = params.get("state") or "failed"
    if which not in LISTS:
        raise InvalidInput(f"state must be one of {', '.join(LISTS)}, got {which!r}")
    return which, params.get("queue") or None, params.get("task") or None, \
        page_size(params.get("limit"))


def _listing(request: Request) -> dict[str, Any]:
    """The page's list: failures newest first, or retrying tasks by their next attempt."""
    st = state(request)
    which, queue, task, limit = _params(request)
    cursor = request.query_params.get("cursor")
    query = {k: v for k, v in (("state", which), ("queue", queue), ("task", task)) if v}
    if which == "failed":
        page = st.failures().failed_page(queue, task, cursor, limit)
        after = page.next_cursor
        items: list[dict[str, Any]] = [f.as_dict() for f in page.items]
    else:
        tasks = st.service.list_page(TaskFilter.parse(queue, task, "retrying"),
                                     decode_cursor(cursor), limit)
        after = encode_cursor(*tasks.next_cursor) if tasks.next_cursor else None
        items = [v.as_dict() for v in tasks.items]
    nxt = "/failed?" + urlencode({**query, "cursor": after, "limit": limit}) if after else None
    return {"which": which, "queue": queue, "task": task, "items": items, "next_url": nxt,
            "query": query}


async def failed_page(request: Request) -> Response:
    data = await state(request).call(_listing, request)
    return render(request, "failed.html", page_name="failed", **data)


def _ident(body: dict[str, str]) -> str:
    """The id of the task acted on, from the body (a django.tasks id may hold ``/``)."""
    ident = body.get("id", "").strip()
    if not ident or len(ident) > 200:
        raise InvalidInput("give the task's id (1-200 characters)")
    return ident


def _act(request: Request, body: dict[str, str]) -> Done:
    action = request.path_params["action"]
    if action not in ("retry", "discard"):
        raise InvalidInput("action must be retry or discard")
    svc = state(request).failures()
    return svc.retry(_ident(body)) if action == "retry" else svc.discard(_ident(body))


async def act(request: Request, body: dict[str, str]) -> Response:
    done = await state(request).call(_act, request, body)
    back = {"state": body.get("back") if body.get("back") in LISTS else "failed",
            "msg": done.detail}
    return RedirectResponse(f"/failed?{urlencode(back)}", status_code=303)


async def api_failed(request: Request) -> Response:
    st = state(request)
    _, queue, task, limit = _params(request)
    page = await st.call(st.failures().failed_page, queue, task,
                         request.query_params.get("cursor"), limit)
    return JSONResponse({"failed": [f.as_dict() for f in page.items],
                         "next_cursor": page.next_cursor})


async def api_act(request: Request, body: dict[str, str]) -> Response:
    return JSONResponse((await state(request).call(_act, request, body)).as_dict())


def routes(guard: Guard) -> list[Route]:
    return [
        Route("/failed", failed_page),
        Route("/failed/{action}", guard(act), methods=["POST"]),
        Route("/api/failed", api_failed),
        Route("/api/failed/{action}", guard(api_act), methods=["POST"]),
    ]
