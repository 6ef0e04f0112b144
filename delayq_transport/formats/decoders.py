"""Pluggable message decoders: turn a row's payload into something a person can read.

Each broker format registers a :class:`Decoder` (Celery's is built in; the Dramatiq broker
registers its own). ``decode`` returns None when a payload is not its format, so the first
decoder that recognises a payload wins and unknown payloads still show as raw bytes.
``with_eta`` rewrites the payload's own notion of "when" so a rescheduled message agrees with
its row (a Celery worker holds a message whose ``eta`` header is in the future until then).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import celery as celery_message
from .django_tasks import decode_django_task, run_after_iso, with_run_after
from .dramatiq import decode_dramatiq

HIDDEN = "(hidden)"


@dataclass
class DecodedMessage:
    """What a decoder extracts; ``search_text`` is what the list's text match looks in."""

    format: str
    task: str | None = None
    task_id: str | None = None
    args: Any = None
    kwargs: Any = None
    eta: str | None = None
    expires: str | None = None
    retries: int | None = None
    priority: int | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def search_text(self) -> str:
        return json.dumps([self.args, self.kwargs], default=str, ensure_ascii=False)

    def as_dict(self, *, hide_args: bool = False) -> dict[str, Any]:
        headers = dict(self.headers)
        if hide_args:
            for name in ("argsrepr", "kwargsrepr"):
                if name in headers:
                    headers[name] = HIDDEN
        return {
            "format": self.format, "task": self.task, "task_id": self.task_id,
            "args": HIDDEN if hide_args else self.args,
            "kwargs": HIDDEN if hide_args else self.kwargs,
            "eta": self.eta, "expires": self.expires, "retries": self.retries,
            "priority": self.priority, "headers": headers, "properties": self.properties,
        }


@dataclass(frozen=True)
class Decoder:
    name: str
    decode: Callable[[bytes], DecodedMessage | None]
    with_eta: Callable[[bytes, datetime], bytes | None] | None = None


_DECODERS: list[Decoder] = []


def register_decoder(decoder: Decoder, *, first: bool = False) -> None:
    """Add a decoder (replacing one of the same name); ``first`` tries it before the others."""
    _DECODERS[:] = [d for d in _DECODERS if d.name != decoder.name]
    _DECODERS.insert(0, decoder) if first else _DECODERS.append(decoder)


def decoders() -> list[Decoder]:
    return list(_DECODERS)


def decode(payload: bytes) -> DecodedMessage:
    for decoder in _DECODERS:
        try:
            found = decoder.decode(payload)
        except Exception:  # noqa: BLE001 - a decoder that chokes just does not claim it
            found = None
        if found is not None:
            return found
    preview = payload[:2000].decode("utf-8", errors="replace")
    return DecodedMessage("raw", args=preview)


def with_eta(payload: bytes, eta: datetime) -> bytes | None:
    """The payload rewritten to carry ``eta``, by the decoder that owns its format; None if
    no decoder knows how (the caller refuses to move such a row)."""
    for decoder in _DECODERS:
        if decoder.with_eta is None or decoder.decode(payload) is None:
            continue
        return decoder.with_eta(payload, eta)
    return None


# -- Celery (kombu virtual-transport messages) -----------------------------------------------


def _celery_body(message: dict[str, Any]) -> Any:
    body = message.get("body")
    if message.get("properties", {}).get("body_encoding") == "base64" and isinstance(body, str):
        body = base64.b64decode(body)
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if message.get("content-type") == "application/json" and isinstance(body, str):
        return json.loads(body)
    return body


def decode_celery(payload: bytes) -> DecodedMessage | None:
    """A kombu message; a Celery task (protocol 2 headers, or protocol 1 body) when it is one."""
    try:
        message = celery_message.decode(payload)
    except ValueError:
        return None
    if not isinstance(message, dict) or "properties" not in message:
        return None
    headers = message.get("headers") or {}
    props = message.get("properties") or {}
    body = _celery_body(message)
    decoded = DecodedMessage("kombu", headers=headers, properties=props,
                             priority=props.get("priority"), args=body)
    if headers.get("task"):  # protocol 2
        decoded.format = "celery"
        decoded.task, decoded.task_id = headers.get("task"), headers.get("id")
        decoded.eta, decoded.expires = headers.get("eta"), headers.get("expires")
        decoded.retries = headers.get("retries")
        if isinstance(body, list) and len(body) >= 2:
            decoded.args, decoded.kwargs = body[0], body[1]
    elif isinstance(body, dict) and body.get("task"):  # protocol 1
        decoded.format = "celery"
        decoded.task, decoded.task_id = body.get("task"), body.get("id")
        decoded.args, decoded.kwargs = body.get("args"), body.get("kwargs")
        decoded.eta, decoded.expires = body.get("eta"), body.get("expires")
        decoded.retries = body.get("retries")
    return decoded


def celery_with_eta(payload: bytes, eta: datetime) -> bytes | None:
    message = celery_message.decode(payload)
    headers = message.get("headers") or {}
    if not headers.get("task"):
        return payload if "properties" in message else None  # no ETA to carry: as is
    headers["eta"] = eta.astimezone(UTC).isoformat()
    message["headers"] = headers
    return celery_message.encode(message)


register_decoder(Decoder("celery", decode_celery, celery_with_eta))


# -- Dramatiq (the delayq Dramatiq broker's rows) --------------------------------------------


def _iso_ms(ms: Any) -> str | None:
    return None if ms is None else datetime.fromtimestamp(int(ms) / 1000, UTC).isoformat()


def decode_dramatiq_message(payload: bytes) -> DecodedMessage | None:
    """A Dramatiq message (JSON, as Dramatiq's default encoder writes it)."""
    data = decode_dramatiq(payload)
    if data is None:
        return None
    return DecodedMessage(
        "dramatiq", task=data["name"], task_id=data["id"], args=data["args"],
        kwargs=data["kwargs"], eta=_iso_ms(data["eta_ms"]), retries=data["retries"],
        priority=data["options"].get("broker_priority"),
        headers={k: v for k, v in data["options"].items() if k != "eta"},
        properties={"queue": data["queue"], "periodic": data["periodic"],
                    "message_timestamp": data["message_timestamp"]})


def dramatiq_with_eta(payload: bytes, eta: datetime) -> bytes | None:
    """The row's scheduledAt decides delivery; the message's ``eta`` option follows it so
    Dramatiq's middleware (AgeLimit, logs) sees the new time."""
    data = json.loads(payload)
    options = data.setdefault("options", {})
    if "eta" in options:
        options["eta"] = int(eta.timestamp() * 1000)
    return json.dumps(data, separators=(",", ":")).encode()


register_decoder(Decoder("dramatiq", decode_dramatiq_message, dramatiq_with_eta))


# -- Django's task framework (delayq_transport/django/tasks.py) ------------------------------


def decode_django_task_message(payload: bytes) -> DecodedMessage | None:
    """A django.tasks task (JSON, formats/django_tasks.py); the task id is the row's key."""
    data = decode_django_task(payload)
    if data is None:
        return None
    return DecodedMessage(
        "django", task=data["task"], args=data["args"], kwargs=data["kwargs"],
        eta=run_after_iso(data), priority=data["priority"],
        properties={"queue": data["queue"], "backend": data["backend"],
                    "enqueued_at": _iso_ms(data.get("enqueued_at"))})


register_decoder(Decoder("django", decode_django_task_message, with_run_after))
