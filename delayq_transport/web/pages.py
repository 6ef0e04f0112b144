"""HTML pages: overview (+ timeline), task list, one task with its actions, beat entries."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..browse import TaskNotFound, decode_cursor, encode_cursor
from ..browse.beat import beat_entries, set_beat_enabled
from ..browse.filters import STATES, page_size
from . import chart
from .context import Guard, outcome_of, render, state
from .forms import beat_action, filter_from, hours_param, reschedule_by, watch_ids


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
    st = state(request)
    ident = request.path_params["ident"]
    try:
        view = await st.call(st.service.find, ident)
    except TaskNotFound:
        if ident.lstrip("#").isdigit() or (st.result_backend() is None and await outcome_of(
                request, ident) is None):
            raise
        return RedirectResponse(f"/outcomes/{ident}", status_code=303)  # ran: its outcome
    # Celery's outcome is in the app's result backend, a django.tasks task's in delayq's own.
    with_outcome = view.message is not None and view.message.format in ("celery", "django")
    return render(request, "task.html", task=view.as_dict(full=True), view=view,
                  outcome=await outcome_of(request, view.row.key) if with_outcome else None)


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
    result = await st.call(reschedule_by, st, ident, body)
    return _back(str(result.id), result.detail)


async def run_now(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    result = await st.call(st.service.run_now, request.path_params["ident"])
    return _back(str(result.id), result.detail)


async def watch(request: Request) -> Response:
    st = state(request)
    found = await st.call(st.service.watch, watch_ids(request))
    return render(request, "watch.html", found=found)


async def beat(request: Request) -> Response:
    st = state(request)
    entries = await st.call(beat_entries, st.queue)
    return render(request, "beat.html", entries=entries, page="beat")


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
