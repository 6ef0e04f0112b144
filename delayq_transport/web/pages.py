"""HTML pages: overview (+ timeline), task list, one task with its actions, beat entries."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..core.errors import InvalidInput
from ..tasks import (
    TaskFilter,
    TaskNotFound,
    decode_cursor,
    encode_cursor,
    parse_duration,
    parse_when,
)
from ..tasks.beat import beat_entries, set_beat_enabled
from ..tasks.filters import STATES, page_size
from . import chart
from .app import State, state

Guard = Callable[[Callable[[Request, dict[str, str]], Awaitable[Response]]],
                 Callable[[Request], Awaitable[Response]]]


def filter_from(params: Any) -> TaskFilter:
    return TaskFilter.parse(params.get("queue"), params.get("task"), params.get("state"),
                            params.get("eta_after"), params.get("eta_before"), params.get("q"),
                            params.get("beat"))


def hours_param(request: Request) -> float:
    try:
        return float(request.query_params.get("hours") or 24)
    except ValueError as exc:
        raise InvalidInput("hours must be a number") from exc


def render(request: Request, name: str, **context: Any) -> Response:
    st = state(request)
    context.setdefault("msg", request.query_params.get("msg"))
    return st.templates.TemplateResponse(request, name, context)


async def overview(request: Request) -> Response:
    st = state(request)
    hours = hours_param(request)
    data = await st.call(st.service.overview)
    timeline = await st.call(st.service.timeline, hours, 48)
    return render(request, "overview.html", overview=data, chart=chart.build(timeline),
                  hours=hours, page="overview")


async def task_list(request: Request) -> Response:
    st = state(request)
    f = filter_from(request.query_params)
    limit = page_size(request.query_params.get("limit"))
    page = await st.call(st.service.list_page, f, decode_cursor(request.query_params.get(
        "cursor")), limit)
    nxt = None
    if page.next_cursor:
        nxt = "/tasks?" + urlencode({**f.as_query(), "cursor": encode_cursor(*page.next_cursor),
                                     "limit": limit})
    return render(request, "tasks.html", page=page, filter=f, states=STATES, next_url=nxt,
                  query=f.as_query(), page_name="tasks", limit=limit)


async def task_page(request: Request) -> Response:
    from .outcomes import outcome_of, result_backend

    st = state(request)
    ident = request.path_params["ident"]
    try:
        view = await st.call(st.service.find, ident)
    except TaskNotFound:
        if result_backend(st) is None or ident.lstrip("#").isdigit():
            raise
        return RedirectResponse(f"/outcomes/{ident}", status_code=303)  # ran: its outcome
    celery = view.message is not None and view.message.format == "celery"
    return render(request, "task.html", task=view.as_dict(full=True), view=view,
                  outcome=await outcome_of(request, view.row.key) if celery else None)


def _back(ident: str, msg: str, gone: bool = False) -> Response:
    where = "/tasks" if gone else f"/tasks/{ident}"
    return RedirectResponse(f"{where}?{urlencode({'msg': msg})}", status_code=303)


async def cancel(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    result = await st.call(st.service.cancel, request.path_params["ident"])
    return _back(str(result.id), result.detail, gone=True)


async def reschedule(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    ident = request.path_params["ident"]
    result = await st.call(_reschedule, st, ident, body)
    return _back(str(result.id), result.detail)


def _reschedule(st: State, ident: str, body: dict[str, str]) -> Any:
    if body.get("in"):
        return st.service.reschedule_in(ident, parse_duration(body["in"], "in"))
    if body.get("at"):
        return st.service.reschedule(ident, parse_when(body["at"], "at"))
    raise InvalidInput("give a new time (at) or a delay (in)")


async def run_now(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    result = await st.call(st.service.run_now, request.path_params["ident"])
    return _back(str(result.id), result.detail)


def watch_ids(request: Request) -> list[str]:
    ids = [i.strip() for i in request.query_params.get("ids", "").split(",") if i.strip()]
    if not ids:
        raise InvalidInput("give task ids to watch: /watch?ids=ID1,ID2")
    return ids


async def watch(request: Request) -> Response:
    st = state(request)
    found = await st.call(st.service.watch, watch_ids(request))
    return render(request, "watch.html", found=found)


async def beat(request: Request) -> Response:
    st = state(request)
    entries = await st.call(beat_entries, st.queue)
    return render(request, "beat.html", entries=entries, page="beat")


def beat_action(request: Request, body: dict[str, str]) -> tuple[str, bool]:
    """(entry name, enable?) of a beat toggle; the name travels in the body (it may hold /)."""
    action = request.path_params["action"]
    if action not in ("enable", "disable"):
        raise InvalidInput("action must be enable or disable")
    name = body.get("name", "")
    if not name or len(name) > 200:
        raise InvalidInput("give the beat entry's name (1-200 characters)")
    return name, action == "enable"


async def beat_toggle(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    name, enabled = beat_action(request, body)
    msg = await st.call(set_beat_enabled, st.queue, name, enabled)
    return RedirectResponse(f"/beat?{urlencode({'msg': msg})}", status_code=303)


def routes(guard: Guard) -> list[Route]:
    return [
        Route("/", overview),
        Route("/tasks", task_list),
        Route("/tasks/{ident}", task_page),
        Route("/tasks/{ident}/cancel", guard(cancel), methods=["POST"]),
        Route("/tasks/{ident}/reschedule", guard(reschedule), methods=["POST"]),
        Route("/tasks/{ident}/run-now", guard(run_now), methods=["POST"]),
        Route("/watch", watch),
        Route("/beat", beat),
        Route("/beat/{action}", guard(beat_toggle), methods=["POST"]),
    ]
