"""The per-row Python encoder: the reference for what a scheduled row becomes.

Most rows never come here: :mod:`.encode` builds their messages in Spark's JVM. This path
takes the rows the JVM path does not cover (argument types whose ``repr`` the JVM cannot
reproduce, strings with control characters, null ETAs, bad keys, past ETAs under
``past_eta="skip"``), builds the same message with :class:`~..formats.celery.TaskMessageEncoder`,
or says why the row cannot be one. Both paths derive the same key for the same row.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from decimal import Decimal
from functools import cache
from typing import Any

from ..core import InvalidInput
from ..core.integrations import copy_record
from ..core.queue import to_ms, validate_key
from ..formats import celery as message

#: Namespace of the uuid5 keys and delivery tags derived from row content (never change it:
#: re-runs must derive the same keys).
KEY_NAMESPACE = uuid.UUID("6f1d3c2e-5b7a-4e8f-9a0b-d1e2f3a4b5c6")
_NAMESPACE_BYTES = KEY_NAMESPACE.bytes
_REPR_CHARS = 200
_PLAIN = (str, int, float, bool, type(None))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class BadRow:
    """A row that could not become a message, and why (values shown as truncated reprs)."""

    reason: str
    row: dict[str, str]


@dataclass(frozen=True)
class Plan:
    """Everything a partition needs, picklable; row layout: [eta] [key] args... kwargs..."""

    database_url: str
    table: str
    task: str
    queue: str
    priority: int | None
    kind: str
    now_ms: int
    countdown_ms: int | None
    has_key: bool
    arg_count: int
    kwarg_names: tuple[str, ...]
    ntz_fields: frozenset[int]
    past_eta: str
    can_update: bool
    chunk_size: int
    origin: str
    sample_size: int
    #: With a run id, each partition is one part of that run (core/ledgers/runs.py).
    run_id: str | None = None
    key_at: int = field(init=False)
    args_at: int = field(init=False)
    kwargs_at: int = field(init=False)

    def __post_init__(self) -> None:
        # Offsets are read for every row: computed once, not per access.
        key_at = 0 if self.countdown_ms is not None else 1
        object.__setattr__(self, "key_at", key_at)
        object.__setattr__(self, "args_at", key_at + int(self.has_key))
        object.__setattr__(self, "kwargs_at", key_at + int(self.has_key) + self.arg_count)


def slow_record(plan: Plan, row: Sequence[Any]) -> tuple[bytes | None, str | None, str | None]:
    """(binary COPY tuple, None, None), or (None, reason, the row shown as JSON) if bad."""
    try:
        key, payload, at_ms = prepare(plan, row)
    except (InvalidInput, TypeError, ValueError, OverflowError) as exc:
        return None, str(exc), json.dumps(describe(plan, row))
    return copy_record(key, plan.kind, payload, at_ms), None, None


def prepare(plan: Plan, row: Sequence[Any]) -> tuple[str, bytes, int]:
    """One row -> (key, stored message of its Celery task, ETA in ms); raises if it cannot be."""
    at_ms, eta_token = _row_eta(plan, row)
    args = [_jsonable(row[i], i in plan.ntz_fields) for i in range(plan.args_at, plan.kwargs_at)]
    kwargs = {name: _jsonable(row[plan.kwargs_at + j], plan.kwargs_at + j in plan.ntz_fields)
              for j, name in enumerate(plan.kwarg_names)}
    key = _row_key(plan, row, args, kwargs, eta_token)
    # The delivery tag is content-derived, so an unchanged row re-offered with
    # on_conflict="update" is IGNORED.
    payload = encoder(plan.task, plan.queue, plan.priority, plan.origin).encode(
        args, kwargs, task_id=key, eta=at_of(at_ms), delivery_tag=uuid5(f"{plan.kind}\x00{key}"))
    return key, payload, at_ms


@cache
def encoder(
    task: str, queue: str, priority: int | None, origin: str
) -> message.TaskMessageEncoder:
    """One per task and process: the message skeleton is serialised once."""
    return message.TaskMessageEncoder(task, queue=queue, priority=priority, origin=origin)


def _row_eta(plan: Plan, row: Sequence[Any]) -> tuple[int, int | str]:
    """(ETA in epoch ms, what the default key hashes for it)."""
    if plan.countdown_ms is not None:
        return plan.now_ms + plan.countdown_ms, f"countdown:{plan.countdown_ms}"
    ms = eta_ms(row[0])
    if ms < plan.now_ms and plan.past_eta != "run":
        raise InvalidInput(past_reason(ms, plan.past_eta))
    return ms, ms


def past_reason(ms: int, policy: str = "error") -> str:
    return f"eta {at_of(ms).isoformat()} is in the past (past_eta={policy!r})"


def eta_ms(value: object) -> int:
    """An ETA cell as epoch ms; naive datetimes and strings without an offset are UTC."""
    if value is None:
        raise InvalidInput("eta is null")
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # already converted by Spark (unix_millis of a timestamp column)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise InvalidInput(f"eta {value!r} is not an ISO-8601 timestamp") from exc
    if isinstance(value, datetime):
        return to_ms(value if value.tzinfo else value.replace(tzinfo=UTC), what="eta")
    if isinstance(value, date):
        return to_ms(datetime.combine(value, dtime(), UTC), what="eta")
    raise InvalidInput(f"eta must be a timestamp, got {type(value).__name__} {value!r}")


def _row_key(
    plan: Plan, row: Sequence[Any], args: list[Any], kwargs: dict[str, Any], eta_token: int | str
) -> str:
    if not plan.has_key:
        return default_key(plan.task, args, kwargs, eta_token)
    raw = row[plan.key_at]
    if raw is None:
        raise InvalidInput("key is null")
    return validate_key(raw if isinstance(raw, str) else str(raw))


def default_key(task: str, args: Sequence[Any], kwargs: Mapping[str, Any], eta: int | str) -> str:
    """uuid5 of the canonical JSON of (task, args, kwargs, eta): same row, same task id."""
    try:
        canonical = json.dumps([task, list(args), dict(kwargs), eta], sort_keys=True,
                               separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"task {task} arguments are not JSON-serialisable: {exc}") from exc
    return uuid5(canonical)


def uuid5(name: str) -> str:
    """``str(uuid.uuid5(KEY_NAMESPACE, name))`` without building UUID objects (hot path)."""
    h = hashlib.sha1(_NAMESPACE_BYTES + name.encode()).hexdigest()
    variant = "89ab"[int(h[16], 16) & 0x3]
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{variant}{h[17:20]}-{h[20:32]}"


def _jsonable(value: Any, ntz: bool = False) -> Any:
    """Spark cell -> what Celery's JSON carries; kombu's typed forms keep datetime/Decimal/bytes.

    Naive datetimes of ``timestamp`` columns are local time (PySpark's conversion), those of
    ``timestamp_ntz`` columns (``ntz``) are wall-clock and stay naive.
    """
    if type(value) in _PLAIN:
        return value
    if hasattr(value, "asDict"):  # a Row (struct column)
        return {k: _jsonable(v, ntz) for k, v in value.asDict().items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, ntz) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v, ntz) for k, v in value.items()}
    if isinstance(value, datetime):
        aware = value if value.tzinfo or ntz else value.astimezone(UTC)
        return {"__type__": "datetime", "__value__": aware.isoformat()}
    if isinstance(value, date):
        return {"__type__": "date", "__value__": value.isoformat()}
    if isinstance(value, Decimal):
        return {"__type__": "decimal", "__value__": str(value)}
    if isinstance(value, bytes | bytearray):
        return {"__type__": "base64", "__value__": base64.b64encode(value).decode()}
    return value  # anything else: JSON decides, and refuses with a reason


def describe(plan: Plan, row: Sequence[Any]) -> dict[str, str]:
    """A bad row for humans: its fields as truncated reprs (the sample must stay small)."""
    shown: dict[str, Any] = {}
    if plan.countdown_ms is None:
        shown["eta"] = row[0]
    if plan.has_key:
        shown["key"] = row[plan.key_at]
    shown["args"] = list(row[plan.args_at : plan.kwargs_at])
    shown["kwargs"] = dict(zip(plan.kwarg_names, row[plan.kwargs_at :], strict=True))
    described = {k: _truncate(repr(v)) for k, v in shown.items()}
    if isinstance(shown.get("eta"), int):  # epoch ms from Spark: show the instant instead
        described["eta"] = at_of(shown["eta"]).isoformat()
    return described


def _truncate(text: str) -> str:
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


def at_of(ms: int) -> datetime:
    """Exact, unlike ``datetime.fromtimestamp(ms / 1000)`` (float rounding)."""
    return _EPOCH + timedelta(milliseconds=ms)
