"""The task list's filters and its keyset cursor, validated once for the CLI and the web.

Everything a user types arrives here as text; what leaves is typed and bounded, so the layers
below only see values they can bind.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from ..core import InvalidInput
from ..core.queue import MAX_KIND_CHARS, to_ms

STATES = ("due", "scheduled", "in_flight", "redelivered", "retrying")
MAX_TEXT = 200
MAX_PAGE = 500
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: str, what: str = "duration") -> timedelta:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` (seconds when no unit)."""
    found = _DURATION_RE.match(str(text))
    if not found:
        raise InvalidInput(f"{what}: expected a number with an optional unit ms/s/m/h/d, "
                           f"got {text!r}")
    seconds = float(found.group(1)) * _UNIT_S[found.group(2)]
    if seconds > 3650 * 86400:
        raise InvalidInput(f"{what}: more than ten years ({text!r})")
    return timedelta(seconds=seconds)


def parse_when(text: str, what: str = "time") -> datetime:
    """An ISO-8601 time (naive means UTC, like Celery's ETAs)."""
    try:
        value = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(f"{what}: expected an ISO-8601 time like 2026-01-31T09:00:00Z, "
                           f"got {text!r}") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _text(value: str | None, what: str, limit: int = MAX_TEXT) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > limit or any(ord(c) < 32 for c in value):
        raise InvalidInput(f"{what}: at most {limit} printable characters")
    return value


@dataclass(frozen=True)
class TaskFilter:
    """A list query. ``queue`` names a Celery queue (all its priority kinds) or a raw kind."""

    queue: str | None = None
    task: str | None = None
    state: str | None = None
    eta_after: datetime | None = None
    eta_before: datetime | None = None
    text: str | None = None
    beat_entry: str | None = None

    @classmethod
    def parse(cls, queue: str | None = None, task: str | None = None,
              state: str | None = None, eta_after: str | None = None,
              eta_before: str | None = None, text: str | None = None,
              beat_entry: str | None = None) -> TaskFilter:
        if state in ("", None):
            state = None
        elif state.replace("-", "_").replace(" ", "_") in STATES:
            state = state.replace("-", "_").replace(" ", "_")
        else:
            raise InvalidInput(f"state must be one of {', '.join(STATES)}, got {state!r}")
        return cls(
            queue=_text(queue, "queue", MAX_KIND_CHARS), task=_text(task, "task"), state=state,
            eta_after=parse_when(eta_after, "eta after") if eta_after else None,
            eta_before=parse_when(eta_before, "eta before") if eta_before else None,
            text=_text(text, "text"), beat_entry=_text(beat_entry, "beat entry"),
        )

    @property
    def needs_payload(self) -> bool:
        """Whether rows must be decoded (a retry count is in the message)."""
        return bool(self.task or self.text) or self.state == "retrying"

    @property
    def narrows(self) -> bool:
        """Whether rows must be examined beyond the index (state, task, text, beat entry)."""
        return bool(self.state or self.task or self.text or self.beat_entry)

    def bounds_ms(self, now_ms: int) -> tuple[int | None, int | None]:
        """The scheduledAt range the index can answer (state due / scheduled narrow it)."""
        lo = None if self.eta_after is None else to_ms(self.eta_after, what="eta after")
        hi = None if self.eta_before is None else to_ms(self.eta_before, what="eta before")
        if self.state == "due":
            hi = now_ms + 1 if hi is None else min(hi, now_ms + 1)
        elif self.state in ("scheduled", "in_flight"):
            lo = now_ms + 1 if lo is None else max(lo, now_ms + 1)
        return lo, hi

    def without_text(self) -> TaskFilter:
        return replace(self, text=None)

    def as_query(self) -> dict[str, str]:
        """The filter as query-string parameters (links to the next page keep it)."""
        out = {"queue": self.queue, "task": self.task, "state": self.state,
               "eta_after": self.eta_after.isoformat() if self.eta_after else None,
               "eta_before": self.eta_before.isoformat() if self.eta_before else None,
               "q": self.text, "beat": self.beat_entry}
        return {k: v for k, v in out.items() if v}


def encode_cursor(at_ms: int, row_id: int) -> str:
    return base64.urlsafe_b64encode(f"{at_ms}:{row_id}".encode()).decode().rstrip("=")


def decode_cursor(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        at, row_id = raw.split(":")
        return int(at), int(row_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"invalid page cursor {text[:40]!r}") from exc


def page_size(value: int | str | None, default: int = 50) -> int:
    try:
        size = default if value in (None, "") else int(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"limit must be an integer, got {value!r}") from exc
    if not 1 <= size <= MAX_PAGE:
        raise InvalidInput(f"limit must be 1..{MAX_PAGE}, got {size}")
    return size
