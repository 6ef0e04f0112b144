"""Outcomes: every front end's dead letters (list, show with traceback, requeue, delete) and
Celery outcomes read from the app's result backend; pages and their JSON API."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..browse import TaskNotFound, decode_cursor, encode_cursor
from ..browse.deadletters import DeadLetterPage
from ..browse.filters import page_size
from ..core import InvalidInput
from .context import Guard, outcome_of, render, state


def _page_of(request: Request) -> tuple[str | None, DeadLetterPage, int]:
    st = state(request)
    params = request.query_params
    limit = page_size(params.get("limit"))
    page = st.dead_letters().list_page(params.get("queue") or None,
                                      decode_cursor(params.get("cursor")), limit)
    return params.get("queue") or None, page, limit


def _listing(request: Request) -> dict[str, Any]:
    svc = state(request).dead_letters()
    queue, page, limit = _page_of(request)
    nxt = None
    if page.next_cursor:
        nxt = "/dead-letters?" + urlencode({**({"queue": queue} if queue else {}),
                                            "cursor": encode_cursor(*page.next_cursor),
                                            "limit": limit})
    return {"queues": svc.queues(), "queue": queue, "page": page, "next_url": nxt}


async def dead_letter_list(request: Request) -> Response:
    data = await state(request).call(_listing, request)
    return render(request, "dead_letters.html", page_name="dead_letters", **data)


async def dead_letter_page(request: Request) -> Response:
    st = state(request)
    letter = await st.call(st.dead_letters().find, request.path_params["ident"])
    return render(request, "dead_letter.html", page_name="dead_letters", letter=letter,
                  d=letter.as_dict(full=True))


def _back(result: dict[str, Any]) -> Response:
    where = "/dead-letters?" + urlencode({"queue": result["queue"], "msg": result["detail"]})
    return RedirectResponse(where, status_code=303)


def _change(action: str, respond: Callable[[dict[str, Any]], Response]
            ) -> Callable[[Request, dict[str, str]], Awaitable[Response]]:
    """A state change of one dead letter (``requeue``/``delete`` of the service), answered as a
    page redirect or as JSON: the same call behind the page's buttons and the API."""

    async def endpoint(request: Request, body: dict[str, str]) -> Response:
        st = state(request)
        return respond(await st.call(getattr(st.dead_letters(), action),
                                     request.path_params["ident"]))

    return endpoint


requeue, delete = _change("requeue", _back), _change("delete", _back)


async def outcome_page(request: Request) -> Response:
    """A task that left the queue (ran, failed, or never existed): its outcome, if a result
    backend is configured, else where outcomes live."""
    st = state(request)
    task_id = request.path_params["task_id"]
    outcome = await outcome_of(request, task_id)
    try:
        queued = await st.call(st.service.find, task_id)
    except (TaskNotFound, InvalidInput):
        queued = None
    return render(request, "outcome.html", task_id=task_id, outcome=outcome, queued=queued)


# -- JSON API -------------------------------------------------------------------------------


def _api_listing(request: Request) -> dict[str, Any]:
    svc = state(request).dead_letters()
    _, page, _ = _page_of(request)
    return {"queues": svc.queues(),
            "dead_letters": [d.as_dict() for d in page.items],
            "next_cursor": encode_cursor(*page.next_cursor) if page.next_cursor else None}


async def api_list(request: Request) -> Response:
    return JSONResponse(await state(request).call(_api_listing, request))


async def api_show(request: Request) -> Response:
    st = state(request)
    letter = await st.call(st.dead_letters().find, request.path_params["ident"])
    return JSONResponse(letter.as_dict(full=True))


api_requeue, api_delete = _change("requeue", JSONResponse), _change("delete", JSONResponse)


async def api_outcome(request: Request) -> Response:
    outcome = await outcome_of(request, request.path_params["task_id"])
    if outcome is None:
        return JSONResponse({"error": "no result backend configured: start delayq web with "
                                      "--result-backend URL (the app's result_backend)"},
                            status_code=404)
    return JSONResponse(asdict(outcome) | {"ready": outcome.ready})


def routes(guard: Guard) -> list[Route]:
    return [
        Route("/dead-letters", dead_letter_list),
        Route("/dead-letters/{ident}", dead_letter_page),
        Route("/dead-letters/{ident}/requeue", guard(requeue), methods=["POST"]),
        Route("/dead-letters/{ident}/delete", guard(delete), methods=["POST"]),
        Route("/outcomes/{task_id:path}", outcome_page),
        Route("/api/dead-letters", api_list),
        Route("/api/dead-letters/{ident}", api_show),
        Route("/api/dead-letters/{ident}", guard(api_delete), methods=["DELETE"]),
        Route("/api/dead-letters/{ident}/requeue", guard(api_requeue), methods=["POST"]),
        Route("/api/dead-letters/{ident}/delete", guard(api_delete), methods=["POST"]),
        Route("/api/outcomes/{task_id}", api_outcome),
    ]
