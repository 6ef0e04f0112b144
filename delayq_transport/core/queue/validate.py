"""Validation of what callers hand the queue: keys, kinds, payloads and schedule times.

Bad input is refused with :class:`~..db.errors.InvalidInput` naming the problem, before any
statement runs, so nothing stored is touched by a call that cannot succeed.
"""

from __future__ import annotations

from datetime import datetime

from ..db.errors import InvalidInput
from .timeutil import due_ms

MAX_KEY_CHARS = 200
MAX_KIND_CHARS = 100
#: A kind may not start with this character: wake-up notifications use it to mark a search
#: marker (core/queue/announce.py), which no consumer may take for a due time of its own kind.
RESERVED_KIND_PREFIX = "\x1e"


def validate_key(key: object, *, what: str = "key", limit: int = MAX_KEY_CHARS) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidInput(f"{what} must be a non-empty str, got {key!r}")
    if len(key) > limit:
        raise InvalidInput(
            f"{what} is {len(key)} characters, the limit is {limit}: {key[:40]!r}..."
        )
    if "\x00" in key:
        raise InvalidInput(f"{what} must not contain NUL characters: {key!r}")
    if not key.isascii():
        try:
            key.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: PostgreSQL stores UTF-8 only
            raise InvalidInput(f"{what} is not valid Unicode ({exc.reason}): {key!r}") from None
    return key


def validate_kind(kind: object) -> str:
    kind = validate_key(kind, what="kind", limit=MAX_KIND_CHARS)
    if kind.startswith(RESERVED_KIND_PREFIX):
        raise InvalidInput(f"kind must not start with \\x1e (reserved for wake-ups): {kind!r}")
    return kind


#: Milliseconds of the datetimes already converted in one ``offer_batch`` call.
MsMemo = dict[tuple[datetime, int], int]


def scheduled_ms(at: datetime | None, memo: MsMemo | None) -> int | None:
    """``due_ms`` (rounded up: never before the instant asked for), remembered per batch: a
    batch mostly repeats a few datetimes, and converting each one was the largest client cost
    of ``offer_batch``. ``fold`` is part of the key because two datetimes of one zone compare
    equal across a DST fold."""
    if at is None:
        return None
    if memo is None or not isinstance(at, datetime):
        return due_ms(at, what="scheduled_at")
    key = (at, at.fold)
    ms = memo.get(key)
    if ms is None:
        ms = memo[key] = due_ms(at, what="scheduled_at")
    return ms


def validate_payload(payload: object) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    raise InvalidInput(f"payload must be bytes, got {type(payload).__name__}")


def like_escape(text: str) -> str:
    """``text`` matched literally by LIKE (its ``\\``, ``%`` and ``_`` escaped)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
