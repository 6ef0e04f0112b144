"""The JSON API: the page's operations for scripts (documented in docs/reference/web-api.md)."""

from __future__ import annotations

from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..browse import decode_cursor, encode_cursor
from ..browse.beat import beat_entries, set_beat_enabled
from ..browse.filters import page_size
from ..core import InvalidInput
from .context import Guard, state
from .forms import beat_action, filter_from, hours_param, reschedule_by, watch_ids


async def overview(request: Request) -> Response:
    st = state(request)
    return JSONResponse(await st.call(st.service.overview))


async def timeline(request: Request) -> Response:
    st = state(request)
    try:
        buckets = int(request.query_params.get("buckets") or 48)
    except ValueError as exc:
        raise InvalidInput("buckets must be an integer") from exc
    t = await st.call(st.service.timeline, hours_param(request), buckets,
                      request.query_params.get("queue") or None)
    return JSONResponse(asdict(t))


async def tasks(request: Request) -> Response:
    st = state(request)
    f = filter_from(request.query_params)
    page = await st.call(st.service.list_page, f,
                         decode_cursor(request.query_params.get("cursor")),
                         page_size(request.query_params.get("limit")))
    return JSONResponse({
        "tasks": [v.as_dict() for v in page.items],
        "next_cursor": encode_cursor(*page.next_cursor) if page.next_cursor else None,
        "scanned": page.scanned, "partial": page.partial, "searched_to": page.searched_to,
        "indexed": page.indexed})


async def task(request: Request) -> Response:
    st = state(request)
    view = await st.call(st.service.find, request.path_params["ident"])
    return JSONResponse(view.as_dict(full=True))


async def cancel(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    return JSONResponse(asdict(await st.call(st.service.cancel, request.path_params["ident"])))


async def reschedule(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    result = await st.call(reschedule_by, st, request.path_params["ident"], body)
    return JSONResponse(asdict(result))


async def run_now(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    return JSONResponse(asdict(await st.call(st.service.run_now, request.path_params["ident"])))


async def watch(request: Request) -> Response:
    st = state(request)
    found = await st.call(st.service.watch, watch_ids(request))
    return JSONResponse({"tasks": [
        {"key": key, "state": "gone", "task": None} if view is None else view.as_dict()
        for key, view in found]})


async def beat(request: Request) -> Response:
    st = state(request)
    return JSONResponse({"entries": await st.call(beat_entries, st.queue)})


async def beat_toggle(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    name, enabled = beat_action(request, body)
    msg = await st.call(set_beat_enabled, st.queue, name, enabled)
    return JSONResponse({"name": name, "enabled": enabled, "detail": msg})


async def csrf(request: Request) -> Response:
    return JSONResponse({"csrf_token": state(request).config.csrf_secret})


def routes(guard: Guard) -> list[Route]:
    return [
        Route("/api/overview", overview),
        Route("/api/timeline", timeline),
        Route("/api/tasks", tasks),
        Route("/api/tasks/{ident}", task),
        Route("/api/tasks/{ident}", guard(cancel), methods=["DELETE"]),
        Route("/api/tasks/{ident}/cancel", guard(cancel), methods=["POST"]),
        Route("/api/tasks/{ident}/reschedule", guard(reschedule), methods=["POST"]),
        Route("/api/tasks/{ident}/run-now", guard(run_now), methods=["POST"]),
        Route("/api/watch", watch),
        Route("/api/beat", beat),
        Route("/api/beat/{action}", guard(beat_toggle), methods=["POST"]),
        Route("/api/csrf", csrf),
    ]
