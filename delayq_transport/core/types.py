"""Values that cross the DelayedQueue API: outcomes, envelopes, batch items, status rows."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from .timeutil import from_ms


class OfferOutcome(enum.Enum):
    """What ``offer`` did: a new row, a replaced row, or nothing (same message, or no update)."""

    CREATED = "created"
    UPDATED = "updated"
    IGNORED = "ignored"


class Offer(NamedTuple):
    """One item of ``offer_batch``; ``scheduled_at=None`` means now by the queue's clock."""

    key: str
    payload: bytes
    scheduled_at: datetime | None = None


@dataclass(slots=True)
class Envelope:
    """A delivered message. It stays locked until acked, released, or its lease runs out."""

    id: int
    key: str
    kind: str
    payload: bytes
    scheduled_at_ms: int
    scheduled_at_initially_ms: int
    created_at_ms: int
    lock: str
    is_redelivery: bool
    _ack: Callable[[Envelope], int] = field(repr=False, compare=False)

    @property
    def scheduled_at(self) -> datetime:
        """When the message was due: its original schedule, not the lease."""
        return from_ms(self.scheduled_at_initially_ms)

    @property
    def created_at(self) -> datetime:
        """When the row was first inserted."""
        return from_ms(self.created_at_ms)

    def ack(self) -> bool:
        """Delete the row; False if it was meanwhile re-acquired or replaced (lease lost)."""
        return self._ack(self) == 1


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A row as ``get`` reads it."""

    id: int
    key: str
    kind: str
    payload: bytes
    scheduled_at_ms: int
    scheduled_at_initially_ms: int
    lock: str | None
    created_at_ms: int

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> StoredMessage:
        return cls(row[0], row[1], row[2], bytes(row[3]), row[4], row[5], row[6], row[7])

    @property
    def scheduled_at(self) -> datetime:
        """When the row is due (for a row in flight: when its lease ends)."""
        return from_ms(self.scheduled_at_ms)

    @property
    def in_flight(self) -> bool:
        """Whether a consumer holds the row (its lock is set)."""
        return self.lock is not None


@dataclass(frozen=True, slots=True)
class KindStatus:
    """Counters for one queue partition, as ``delayq status`` prints them."""

    kind: str
    due: int
    scheduled: int
    in_flight: int
    redelivered: int
    oldest_due_lag_ms: int | None
    next_due_at_ms: int | None
    #: "exact", or "at least" when the count stopped at its cap (see core/counts.py).
    due_accuracy: str = "exact"
    #: "exact", "estimate" (from PostgreSQL's statistics) or "at least" (capped, no statistics).
    scheduled_accuracy: str = "exact"

    @property
    def next_due_at(self) -> datetime | None:
        """The earliest ``scheduledAt`` of the kind, or None."""
        return None if self.next_due_at_ms is None else from_ms(self.next_due_at_ms)
