"""Bulk actions on the page and in the API: chosen rows (checkboxes, ``ids``) or every match of
the list's filter (``all``), then cancel, reschedule (``at`` or ``shift``) or run now.

The page first shows a confirmation with the count (``POST /tasks/bulk`` without
``confirmed``), then applies it; ``POST /api/tasks/bulk`` applies at once and
``GET /api/tasks/bulk/preview`` gives the count. A selection of more than
:data:`~.jobs.BACKGROUND_ROWS` rows (or one the preview cannot count quickly) runs in the
background (:mod:`.jobs`): the POST answers at once with the job (``202`` and its status URL in
the API; a redirect to its progress page on the page), and ``GET /api/tasks/bulk/jobs/{id}``
tells its progress and outcome. The work is :mod:`delayq_transport.browse.bulk`'s (shared with
``delayq tasks cancel``); CSRF and read-only are :func:`~.context.guarded`'s.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..browse import TaskFilter, bulk
from ..core import InvalidInput
from .context import Guard, State, render, state
from .forms import filter_from
from .jobs import BACKGROUND_ROWS, BulkJob

FILTER_FIELDS = ("queue", "task", "state", "eta_after", "eta_before", "q", "beat")
MAX_IDS = 10_000
#: How long the POST's own count of a filter the index cannot answer may scan before the
#: action goes to the background anyway (the request stays well under 300 ms).
DECIDE_SCAN_S = 0.05


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


def _run(st: State, fields: dict[str, str], ids: list[int],
         job: BulkJob | None = None) -> bulk.BulkResult:
    """Collect the targets, then apply the action; a background ``job`` hears the progress."""
    action = fields.get("action", "")
    at_ms, shift_ms = bulk.parse_target_time(action, fields.get("at"), fields.get("shift"))
    f, chosen = _targets(st, fields, ids)
    if chosen is not None:
        targets = bulk.Targets.chosen(chosen)
    else:
        def collected(n: int) -> None:
            if job is not None:
                job.collected = n

        targets = bulk.target_ids(st.service, f or TaskFilter(), progress=collected)
    if job is not None:
        job.applying(len(targets))

    def progress(result: bulk.BulkResult) -> None:
        if job is not None:
            job.result = result

    return bulk.apply(st.service, action, targets, at_ms=at_ms, shift_ms=shift_ms,
                      progress=progress)


def _preview(st: State, fields: dict[str, str], ids: list[int]) -> bulk.BulkPreview:
    f, chosen = _targets(st, fields, ids)
    return bulk.preview(st.service, f, chosen)


def _size(st: State, fields: dict[str, str], ids: list[int]) -> bulk.BulkPreview:
    """How big the selection is, within the request's budget: chosen ids are counted as
    given; a filter by the preview (an index count, or a scan of :data:`DECIDE_SCAN_S`)."""
    f, chosen = _targets(st, fields, ids)
    if chosen is not None:
        return bulk.BulkPreview(len(chosen), True, 0)
    return bulk.preview(st.service, f, None, scan_s=DECIDE_SCAN_S)


def _start(st: State, fields: dict[str, str], ids: list[int]) -> BulkJob | bulk.BulkResult:
    """Apply a small selection now; start a large one in the background (its job)."""
    action = fields.get("action", "")
    bulk.parse_target_time(action, fields.get("at"), fields.get("shift"))  # bad input: now
    size = _size(st, fields, ids)
    if size.exact and size.count <= BACKGROUND_ROWS:
        return _run(st, fields, ids)
    return st.bulk_jobs.start(action, size.count, lambda job: _run(st, fields, ids, job))


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
    outcome = await st.call(_start, st, fields, ids)
    if isinstance(outcome, BulkJob):
        back = "?" + urlencode(query) if query else ""
        return RedirectResponse(f"/tasks/bulk/jobs/{outcome.id}{back}", status_code=303)
    return RedirectResponse("/tasks?" + urlencode({**query, "msg": outcome.detail}),
                            status_code=303)


async def api_bulk(request: Request, body: dict[str, str]) -> Response:
    """200 with the outcome for a small selection; 202 with the job for a large one."""
    st = state(request)
    fields, ids = await _request_data(request)
    outcome = await st.call(_start, st, fields, ids)
    if isinstance(outcome, BulkJob):
        return JSONResponse(outcome.as_dict(), status_code=202,
                            headers={"Location": f"/api/tasks/bulk/jobs/{outcome.id}"})
    return JSONResponse(outcome.as_dict())


async def api_job(request: Request) -> Response:
    """A background bulk action's progress and outcome (memory only: no database read)."""
    job = state(request).bulk_jobs.get(request.path_params["job"])
    return JSONResponse(job.as_dict())


async def page_job(request: Request) -> Response:
    """The progress page a large bulk action redirects to; app.js polls :func:`api_job`."""
    job = state(request).bulk_jobs.get(request.path_params["job"])
    query = {k: v for k, v in request.query_params.items() if k in FILTER_FIELDS}
    return render(request, "bulk_job.html", job=job.as_dict(), query=query, page_name="tasks")


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
        Route("/api/tasks/bulk/jobs/{job}", api_job),
        Route("/tasks/bulk/jobs/{job}", page_job),
    ]
