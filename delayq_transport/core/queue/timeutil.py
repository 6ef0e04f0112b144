"""Conversions between aware datetimes and the table's epoch-millisecond BIGINTs.

Naive datetimes are refused: a naive value means "some local time" to one process and UTC to
another, which is exactly the skew a shared queue cannot afford.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ..db.errors import InvalidInput

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_ms(value: datetime, *, what: str = "datetime") -> int:
    if not isinstance(value, datetime):
        raise InvalidInput(f"{what} must be a timezone-aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidInput(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    # Exact integer arithmetic: int(timestamp() * 1000) truncates 2.156 s to 2155 ms.
    return (value - EPOCH) // timedelta(milliseconds=1)


def due_ms(value: datetime, *, what: str = "datetime") -> int:
    """A due time in epoch ms, rounded up: a row is never taken before the instant asked for
    (an eta of 10.0006 s stored as 10.000 s could run 0.6 ms early)."""
    ms = to_ms(value, what=what)
    return ms if (value - EPOCH) % timedelta(milliseconds=1) == timedelta(0) else ms + 1


def from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def duration_ms(value: timedelta | float | int, *, what: str = "duration") -> int:
    """Accept a timedelta or a number of seconds (kombu's convention for transport options)."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise InvalidInput(f"{what} must not be negative, got {seconds} s")
    return round(seconds * 1000)  # round, not int(): 2.156 * 1000 is 2155.9999...
