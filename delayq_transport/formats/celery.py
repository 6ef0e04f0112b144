"""The one place that knows how a Celery message is stored in ``delayed_queue``.

Shared by the kombu transport, beat, Spark, the task listings and metrics (so none of them
imports another). A row's ``payload`` is the kombu virtual-transport message (the dict that
``basic_publish`` hands to ``_put``: body, content-type, headers, properties) as UTF-8 JSON.
The transport stores what kombu gives it; beat and the Spark pipeline build the same dict
with :func:`task_message` without a Celery app, so a normal worker runs their rows like any
``apply_async``.

Keys and kinds:

* a Celery task's row key is its task id: ``Task.retry`` republishes the same id, which then
  replaces the row in place instead of adding a copy; anything else is keyed by its
  delivery tag;
* the kind is the queue name, plus a priority-bucket suffix for priorities other than 0,
  exactly as kombu's Redis transport names its per-priority lists.

:func:`row_of` is the whole mapping from a message published to a queue to its row: the
transport's ``_put`` stores it, and ``delayq move-from`` moves other brokers' messages in with
it.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import uuid
from bisect import bisect
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from kombu.utils.json import dumps as kombu_dumps

from ..core import InvalidInput
from ..core.queue import to_ms
from .deadletters import refuse_queue

__all__ = ["DEFAULT_QUEUE", "PRIORITY_SEP", "PRIORITY_STEPS", "Row", "TaskMessageEncoder",
           "decode", "encode", "eta_of", "kind_for", "kinds_for", "parse_eta", "priority_bucket",
           "protocol1_task", "queue_of_kind", "row_key", "row_of", "task_message"]

#: Priority buckets and separator of kombu's Redis transport: 0 is served first.
PRIORITY_STEPS: tuple[int, ...] = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"
DEFAULT_QUEUE = "celery"


def priority_bucket(priority: int | None, steps: Sequence[int] = PRIORITY_STEPS) -> int:
    """Round a 0-9 priority down to its bucket (Redis semantics: lower runs first)."""
    try:
        value = max(0, min(int(priority or 0), 9))
    except (TypeError, ValueError):
        value = 0
    return steps[max(bisect(steps, value) - 1, 0)]


def kind_for(queue: str, priority: int | None = 0, steps: Sequence[int] = PRIORITY_STEPS) -> str:
    bucket = priority_bucket(priority, steps)
    return f"{queue}{PRIORITY_SEP}{bucket}" if bucket else queue


def kinds_for(queue: str, steps: Sequence[int] = PRIORITY_STEPS) -> list[str]:
    """Every kind of a queue, highest priority first (the order consumers drain them)."""
    return [kind_for(queue, step, steps) for step in steps]


def queue_of_kind(kind: str) -> tuple[str, int]:
    """(queue, priority bucket) of a kind, for display."""
    queue, sep, bucket = kind.partition(PRIORITY_SEP)
    return queue, int(bucket) if sep else 0


def encode(message: Mapping[str, Any]) -> bytes:
    return kombu_dumps(message).encode()


def decode(payload: bytes) -> dict[str, Any]:
    return json.loads(payload)


def row_key(message: Mapping[str, Any]) -> str:
    """Task id for Celery task messages, delivery tag otherwise."""
    headers = message.get("headers") or {}
    task_id = headers.get("id") if headers.get("task") else None
    return str(task_id or message["properties"]["delivery_tag"])


def eta_of(message: Mapping[str, Any]) -> datetime | None:
    """The ETA of a Celery protocol-2 message (its ``eta`` header), aware UTC."""
    return parse_eta((message.get("headers") or {}).get("eta"))


def parse_eta(raw: object) -> datetime | None:
    """An ETA as Celery writes it (ISO-8601; naive means UTC), aware UTC; None if unset."""
    if not raw:
        return None
    try:
        eta = datetime.fromisoformat(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise InvalidInput(f"message has an unparseable eta {raw!r}") from exc
    if not isinstance(eta, datetime):
        raise InvalidInput(f"message has an invalid eta {raw!r}")
    return eta if eta.tzinfo else eta.replace(tzinfo=UTC)  # Celery: naive means UTC


def protocol1_task(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The body of a Celery protocol-1 task message (``task_protocol = 1``), or None.

    Protocol 1 keeps the task's name, id and ETA in the body, not in headers, so only a JSON
    body can be read here; any other message (protocol 2, not a task, another serializer)
    gives None.
    """
    if (message.get("headers") or {}).get("task"):
        return None
    if message.get("content-type") != "application/json":
        return None
    body = message.get("body")
    if not isinstance(body, str | bytes):
        return None
    encoding = (message.get("properties") or {}).get("body_encoding")
    try:
        data = json.loads(base64.b64decode(body, validate=True) if encoding == "base64" else body)
    except (ValueError, TypeError):
        return None
    if isinstance(data, dict) and data.get("task") and data.get("id"):
        return data
    return None


class Row(NamedTuple):
    """What one message published to one queue becomes in the table."""

    key: str
    kind: str
    payload: bytes
    eta: datetime | None


def row_of(queue: str, message: Mapping[str, Any], steps: Sequence[int] = PRIORITY_STEPS,
           *, protocol1: bool = False) -> Row:
    """The row that publishing ``message`` to ``queue`` stores (the transport's ``_put``).

    ``protocol1``: a protocol-1 task (:func:`protocol1_task`) is keyed by its task id and
    scheduled at its ETA too, like a protocol-2 one (the transport publishes protocol 2, and
    does not decode bodies on its hot path).
    """
    refuse_queue(queue)
    kind = kind_for(queue, (message.get("properties") or {}).get("priority"), steps)
    task = protocol1_task(message) if protocol1 else None
    if task is not None:
        return Row(str(task["id"]), kind, encode(message), parse_eta(task.get("eta")))
    return Row(row_key(message), kind, encode(message), eta_of(message))


def _iso(value: datetime | None, what: str) -> str | None:
    if value is None:
        return None
    to_ms(value, what=what)  # refuses naive datetimes with a clear message
    return value.isoformat()


def task_message(
    task: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    task_id: str | None = None,
    eta: datetime | None = None,
    expires: datetime | None = None,
    queue: str = DEFAULT_QUEUE,
    exchange: str = "",
    routing_key: str | None = None,
    priority: int | None = None,
    retries: int = 0,
    origin: str | None = None,
    ignore_result: bool = False,
    extra_headers: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Celery protocol-2 task message, as the virtual transport stores it.

    Mirrors ``celery.app.amqp.AMQP.as_task_v2`` + kombu's ``prepare_message`` so rows written
    without an app (beat installs, Spark partitions) are indistinguishable from apply_async's.
    """
    if not isinstance(task, str) or not task:
        raise InvalidInput(f"task name must be a non-empty str, got {task!r}")
    if not isinstance(args, list | tuple):
        raise InvalidInput(f"task args must be a list or tuple, got {type(args).__name__}")
    kwargs = dict(kwargs or {})
    task_id = task_id or str(uuid.uuid4())
    try:
        body = json.dumps([list(args), kwargs, {"callbacks": None, "errbacks": None,
                                                "chain": None, "chord": None}])
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"task {task} arguments are not JSON-serialisable: {exc}") from exc
    headers: dict[str, Any] = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "shadow": None,
        "eta": _iso(eta, "eta"),
        "expires": _iso(expires, "expires"),
        "group": None,
        "group_index": None,
        "retries": retries,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(tuple(args))[:1024],
        "kwargsrepr": repr(kwargs)[:1024],
        "origin": origin or f"delayq@{socket.gethostname()}",
        "ignore_result": ignore_result,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    headers.update(extra_headers or {})
    return {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": exchange, "routing_key": routing_key or queue},
            "priority": priority_bucket(priority),
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }


#: Placeholders the encoder substitutes; chosen so they cannot occur in a real message.
_SLOTS = ("body", "id", "root_id", "eta", "argsrepr", "kwargsrepr", "correlation_id",
          "delivery_tag")
_SLOT_RE = re.compile('"@@delayq:(' + "|".join(_SLOTS) + ')@@"')
_EMBED_JSON = json.dumps({"callbacks": None, "errbacks": None, "chain": None, "chord": None})


class TaskMessageEncoder:
    """Encodes many messages of one task, fast: the constant JSON is built once.

    ``encode(...)`` returns the same stored payload as ``encode(task_message(...))`` (equal once
    decoded) at a fraction of the cost, which is what bulk producers (the Spark pipeline) spend
    their time on.
    """

    def __init__(self, task: str, **options: Any) -> None:
        template = task_message(task, (), {}, **options)
        template["body"] = "@@delayq:body@@"
        headers, props = template["headers"], template["properties"]
        for name in ("id", "root_id", "eta", "argsrepr", "kwargsrepr"):
            headers[name] = f"@@delayq:{name}@@"
        props["correlation_id"] = "@@delayq:correlation_id@@"
        props["delivery_tag"] = "@@delayq:delivery_tag@@"
        parts = _SLOT_RE.split(kombu_dumps(template))
        self._literals = parts[0::2]
        self._slots = parts[1::2]

    def template(self) -> tuple[list[str], list[str]]:
        """(JSON literals, slot names between them): the message with ``len(names)`` holes,
        each filled with the JSON of that slot's value. The Spark pipeline fills them in the
        JVM (``delayq_transport.spark.encode``)."""
        return list(self._literals), list(self._slots)

    def encode(
        self,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        task_id: str,
        eta: datetime | None = None,
        delivery_tag: str | None = None,
    ) -> bytes:
        try:
            body = f"[{json.dumps(list(args))}, {json.dumps(dict(kwargs))}, {_EMBED_JSON}]"
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"task arguments are not JSON-serialisable: {exc}") from exc
        values = {
            "body": base64.b64encode(body.encode()).decode(),
            "id": task_id,
            "root_id": task_id,
            "eta": _iso(eta, "eta"),
            "argsrepr": repr(tuple(args))[:1024],
            "kwargsrepr": repr(dict(kwargs))[:1024],
            "correlation_id": task_id,
            "delivery_tag": delivery_tag or str(uuid.uuid4()),
        }
        out = [self._literals[0]]
        for slot, literal in zip(self._slots, self._literals[1:], strict=True):
            out.append(json.dumps(values[slot]))
            out.append(literal)
        return "".join(out).encode()
