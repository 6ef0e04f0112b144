"""Values that cross the DelayedQueue API: outcomes, envelopes, batch items, status rows; and
the part of that API the consumer session calls (:class:`SessionQueue`)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

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
    #: "exact", or "at least" when the count stopped at its cap (see core/queue/counts.py).
    due_accuracy: str = "exact"
    #: "exact", "estimate" (from PostgreSQL's statistics) or "at least" (capped, no statistics).
    scheduled_accuracy: str = "exact"

    @property
    def next_due_at(self) -> datetime | None:
        """The earliest ``scheduledAt`` of the kind, or None."""
        return None if self.next_due_at_ms is None else from_ms(self.next_due_at_ms)


@dataclass(frozen=True, slots=True)
class KindOverview:
    """Bounded counters of one kind; a value equal to ``cap`` means "at least cap"."""

    kind: str
    due: int
    later: int
    in_flight: int
    redelivered: int
    oldest_due_lag_ms: int | None
    next_due_at_ms: int | None
    now_ms: int
    cap: int

    @property
    def scheduled(self) -> int:
        return max(self.later - self.in_flight, 0)


@dataclass(frozen=True, slots=True)
class TableStats:
    """Planner estimates and activity counters (cheap, approximate by design)."""

    rows_estimate: int
    histogram: list[int]
    inserted: int
    deleted: int
    live_estimate: int
    now_ms: int

    def estimate_between(self, lo: int, hi: int) -> int:
        """Rows with lo <= scheduledAt < hi from the equi-depth histogram (linear inside a
        histogram bucket); 0 when the table was never analysed."""
        bounds = self.histogram
        total = max(self.rows_estimate, self.live_estimate)
        if len(bounds) < 2 or total <= 0:
            return 0
        per_bucket = 1.0 / (len(bounds) - 1)
        frac = 0.0
        for a, b in zip(bounds, bounds[1:], strict=False):
            if b <= a:
                frac += per_bucket if lo <= a < hi else 0.0
                continue
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                frac += per_bucket * overlap / (b - a)
        return round(frac * total)


#: A delivery as the queue matches it: an envelope, or its (id, lock).
Delivery = Envelope | tuple[int, str]


class SessionQueue(Protocol):
    """What the session calls on the queue (:class:`~.delayed_queue.DelayedQueue` has it)."""

    lease_ms: int

    def poll(self, n: int, kinds: Sequence[str] | None = None
             ) -> tuple[list[Envelope], int | None]: ...

    def ack_many(self, deliveries: Iterable[Delivery]) -> int: ...

    def release(self, deliveries: Iterable[Delivery], delay: float = 0) -> int: ...

    def extend_lease(self, locks: Iterable[str]) -> int: ...

    def lower_watermark(self, kind: str, at_ms: int) -> None: ...

    def reset_watermarks(self) -> None: ...

    def disable_watermarks(self) -> None: ...

    def controls_changed(self, heard: bool | None = None) -> None: ...

    def controlled(self, kinds: Iterable[str]) -> list[str]: ...

    def wake_claimers(self, kinds: Iterable[str]) -> None: ...
