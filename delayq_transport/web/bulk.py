"""Bulk actions on the page and in the API: chosen rows (checkboxes, ``ids``) or every match of
the list's filter (``all``), then cancel, reschedule (``at`` or ``shift``) or run now.

The page first shows a confirmation with the count (``POST /tasks/bulk`` without
``confirmed``), then applies it; ``POST /api/tasks/bulk`` applies at once and
``GET /api/tasks/bulk/preview`` gives the count. The work is :mod:`delayq_transport.tasks.bulk`'s
(shared with ``delayq tasks cancel``); CSRF and read-only are :func:`~.context.guarded`'s.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..core.errors import InvalidInput
from ..tasks import TaskFilter, bulk
from .context import Guard, State, render, state
from .forms import filter_from

FILTER_FIELDS = ("queue", "task", "state", "eta_after", "eta_before", "q", "beat")
MAX_IDS = 10_000


def _ids(values: list[Any]) -> list[int]:
    """Row ids from checkboxes, a JSON list, or "1,2,3"."""
    out: list[int] = []
    for value in values:
        for part in str(value).split(","):
            if part.strip():
                try:
                    out.append(int(part.strip().lstrip("#")))
                except ValueError as exc:
                    raise InvalidInput(f"ids must be row ids, got {part[:40]!r}") from exc
    if len(out) > MAX_IDS:
        raise InvalidInput(f"at most {MAX_IDS:,} ids; use all=1 with a filter for more")
    return list(dict.fromkeys(out))


async def _request_data(request: Request) -> tuple[dict[str, str], list[int]]:
    """The fields and the ids of a bulk request (form with repeated ``ids``, or JSON)."""
    if request.headers.get("content-type", "").startswith("application/json"):
        data = await request.json()  # parsed (and checked) once already by ``guarded``
        raw_ids = data.get("ids") or []
        fields = {str(k): str(v) for k, v in data.items() if v is not None and k != "ids"}
        return fields, _ids(raw_ids if isinstance(raw_ids, list) else [raw_ids])
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str) and k != "ids"}
    return fields, _ids([v for v in form.getlist("ids") if isinstance(v, str)])


def _wants_all(fields: dict[str, str]) -> bool:
    return fields.get("all", "").lower() in ("1", "true", "yes", "on")


def _targets(st: State, fields: dict[str, str], ids: list[int]) -> tuple[TaskFilter | None,
                                                                          list[int] | None]:
    if _wants_all(fields):
        return filter_from(fields), None
    if not ids:
        raise InvalidInput("select tasks (ids), or all=1 for every match of the filter")
    return None, ids


def _run(st: State, fields: dict[str, str], ids: list[int]) -> bulk.BulkResult:
    action = fields.get("action", "")
    at_ms, shift_ms = bulk.parse_target_time(action, fields.get("at"), fields.get("shift"))
    f, chosen = _targets(st, fields, ids)
    targets = chosen if chosen is not None else bulk.target_ids(st.service, f or TaskFilter())
    return bulk.apply(st.service, action, targets, at_ms=at_ms, shift_ms=shift_ms)


def _preview(st: State, fields: dict[str, str], ids: list[int]) -> bulk.BulkPreview:
    f, chosen = _targets(st, fields, ids)
    return bulk.preview(st.service, f, chosen)


async def page_bulk(request: Request, body: dict[str, str]) -> Response:
    """Confirm (the count), then apply and go back to the list with the outcome."""
    st = state(request)
    fields, ids = await _request_data(request)
    query = {k: fields[k] for k in FILTER_FIELDS if fields.get(k)}
    if fields.get("confirmed") != "1":
        bulk.parse_target_time(fields.get("action", ""), fields.get("at"), fields.get("shift"))
        count = await st.call(_preview, st, fields, ids)
        keep = {k: v for k, v in fields.items() if k not in ("csrf_token", "confirmed")}
        return render(request, "bulk_confirm.html", preview=count, fields=keep, ids=ids,
                      action=fields.get("action"), query=query, page_name="tasks")
    result = await st.call(_run, st, fields, ids)
    return RedirectResponse("/tasks?" + urlencode({**query, "msg": result.detail}),
                            status_code=303)


async def api_bulk(request: Request, body: dict[str, str]) -> Response:
    st = state(request)
    fields, ids = await _request_data(request)
    result = await st.call(_run, st, fields, ids)
    return JSONResponse(result.as_dict())


async def api_preview(request: Request) -> Response:
    st = state(request)
    params = dict(request.query_params)
    ids = _ids(request.query_params.getlist("ids"))
    return JSONResponse((await st.call(_preview, st, params, ids)).as_dict())


def routes(guard: Guard) -> list[Route]:
    return [
        Route("/tasks/bulk", guard(page_bulk), methods=["POST"]),
        Route("/api/tasks/bulk", guard(api_bulk), methods=["POST"]),
        Route("/api/tasks/bulk/preview", api_preview),
    ]
