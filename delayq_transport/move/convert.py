"""A source broker's message as delayq stores it, and the id that names it at its source.

Both sources end with the kombu virtual-transport message (the dict a ``delayq+postgresql://``
publish hands to the transport's ``_put``): kombu's Redis transport stores exactly that dict;
a RabbitMQ message is rebuilt into it from its AMQP properties the way kombu's virtual channel
builds it on publish. :func:`delayq_transport.formats.celery.row_of` then gives its row, the
same mapping the transport uses: same key (the task id), kind (queue + priority bucket),
payload and ``scheduledAt`` (the ETA) as publishing the message to delayq would produce.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import InvalidInput
from ..core.queue import OnceOffer
from ..formats import celery as celery_message

#: Prefix of the ids ``delayq move-from`` records in the run ledger (core/queue/once.py).
ONCE_PREFIX = "move-from/"
#: AMQP basic properties kombu's publish carries into a virtual message's ``properties``.
AMQP_PROPERTIES = ("correlation_id", "reply_to", "delivery_mode", "expiration", "message_id",
                   "timestamp", "type", "user_id", "app_id")


class NotMovable(Exception):
    """A message the move leaves where it is; the text says why."""


@dataclass
class SourceMessage:
    """One message taken from (or read in) a source queue."""

    queue: str
    #: The kombu virtual message, or None when the source held something else.
    message: dict[str, Any] | None
    #: Stable across attempts: the same message read again has the same identity.
    identity: str
    #: Why ``message`` is None (unreadable), for the report.
    error: str | None = None

    def task_id(self) -> str:
        """The task id (or what identifies the message) for reports."""
        headers = (self.message or {}).get("headers")
        if isinstance(headers, Mapping) and headers.get("id"):
            return str(headers["id"])
        if self.message is not None and isinstance(headers, Mapping | None):
            task = celery_message.protocol1_task(self.message)
            if task is not None:
                return str(task["id"])
        return f"<{self.identity[:12]}>"


def identity_of(*parts: object) -> str:
    """A hex digest naming a message at its source (queue plus its own id or content)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def check_celery(message: Mapping[str, Any]) -> None:
    """Refuse anything but a Celery task message (protocol 2, or protocol 1 with a JSON body)."""
    if not isinstance(message, Mapping) or not isinstance(message.get("properties"), Mapping):
        raise NotMovable("not a kombu message (no properties)")
    headers = message.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise NotMovable("not a kombu message (headers are not a mapping)")
    if headers.get("task"):
        if not isinstance(headers.get("id"), str) or not headers["id"]:
            raise NotMovable(f"Celery message of task {headers['task']!r} has no task id")
        return
    if celery_message.protocol1_task(message) is None:
        what = message.get("content-type")
        raise NotMovable("not a Celery task message: no task header, and the body is not a "
                         f"protocol-1 task in JSON (content type {what!r})")


def to_offer(item: SourceMessage, steps: Sequence[int]) -> OnceOffer:
    """The once-offer of one source message; NotMovable when it must stay in the source."""
    if item.message is None:
        raise NotMovable(item.error or "unreadable message")
    check_celery(item.message)
    try:
        row = celery_message.row_of(item.queue, item.message, steps, protocol1=True)
    except (InvalidInput, TypeError, ValueError, KeyError) as exc:
        raise NotMovable(str(exc)) from exc
    return OnceOffer(ONCE_PREFIX + item.identity, row.key, row.kind, row.payload, row.eta)


def from_amqp(queue: str, body: bytes, properties: Mapping[str, Any],
              delivery_info: Mapping[str, Any]) -> SourceMessage:
    """A message ``basic_get`` returned, as kombu's virtual channel would have built it when
    the same message was published to delayq (``prepare_message`` + ``basic_publish``)."""
    if not isinstance(body, bytes):
        raise TypeError(f"an AMQP body is bytes, got {type(body).__name__}")
    props = {k: properties[k] for k in AMQP_PROPERTIES if k in properties}
    headers = dict(properties.get("application_headers") or {})
    encoded = base64.b64encode(body).decode()
    identity = identity_of(queue, encoded, headers, props, properties.get("priority"),
                           properties.get("content_type"), properties.get("content_encoding"))
    props.update(
        priority=properties.get("priority") or 0,
        delivery_info={"exchange": delivery_info.get("exchange") or "",
                       "routing_key": delivery_info.get("routing_key") or queue},
        body_encoding="base64",
        # A publish draws a fresh tag; a move reuses the message's identity, so moving it
        # again (after an interruption) stores the very same payload.
        delivery_tag=str(uuid.UUID(hex=identity[:32])),
    )
    message = {"body": encoded, "content-encoding": properties.get("content_encoding"),
               "content-type": properties.get("content_type"), "headers": headers,
               "properties": props}
    return SourceMessage(queue, message, identity)


def from_kombu_json(queue: str, raw: bytes | str) -> SourceMessage:
    """A message as kombu's Redis transport stores it (JSON of the virtual message).

    Its identity is its delivery tag (drawn once per publish; kombu's restore from ``unacked``
    keeps it) with the queue (a message routed to two queues is one row in each)."""
    try:
        message = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return SourceMessage(queue, None, identity_of(queue, _text(raw)),
                             f"not JSON, so not a kombu message: {exc}")
    if not isinstance(message, dict):
        return SourceMessage(queue, None, identity_of(queue, _text(raw)),
                             "not a kombu message (not a JSON object)")
    tag = (message.get("properties") or {}).get("delivery_tag") \
        if isinstance(message.get("properties"), dict) else None
    return SourceMessage(queue, message, identity_of(queue, tag) if tag
                         else identity_of(queue, _text(raw)))


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
