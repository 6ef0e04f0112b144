"""Request parameters the pages and the JSON API read alike: task filters, the timeline's hours,
the ids to watch, a beat toggle, a reschedule."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ..browse import TaskFilter, parse_duration, parse_when
from ..core import InvalidInput
from .context import State


def filter_from(params: Any) -> TaskFilter:
    return TaskFilter.parse(params.get("queue"), params.get("task"), params.get("state"),
                            params.get("eta_after"), params.get("eta_before"), params.get("q"),
                            params.get("beat"))


def hours_param(request: Request) -> float:
    try:
        return float(request.query_params.get("hours") or 24)
    except ValueError as exc:
        raise InvalidInput("hours must be a number") from exc


def reschedule_by(st: State, ident: str, body: dict[str, str]) -> Any:
    """A task moved to ``at`` or by ``in``, as the form or the JSON body says."""
    if body.get("in"):
        return st.service.reschedule_in(ident, parse_duration(body["in"], "in"))
    if body.get("at"):
        return st.service.reschedule(ident, parse_when(body["at"], "at"))
    raise InvalidInput("give a new time (at) or a delay (in)")


def watch_ids(request: Request) -> list[str]:
    ids = [i.strip() for i in request.query_params.get("ids", "").split(",") if i.strip()]
    if not ids:
        raise InvalidInput("give task ids to watch: /watch?ids=ID1,ID2")
    return ids


def beat_action(request: Request, body: dict[str, str]) -> tuple[str, bool]:
    """(entry name, enable?) of a beat toggle; the name travels in the body (it may hold /)."""
    action = request.path_params["action"]
    if action not in ("enable", "disable"):
        raise InvalidInput("action must be enable or disable")
    name = body.get("name", "")
    if not name or len(name) > 200:
        raise InvalidInput("give the beat entry's name (1-200 characters)")
    return name, action == "enable"
