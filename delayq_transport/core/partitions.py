"""Whole-partition operations: dead letters, retention, counts and listings over kinds.

``DelayedQueue`` is about one message at a time; adapters that keep rows no consumer polls
(Dramatiq's dead letters, kept under a kind of their own with a retention) or that wait for a
queue to be empty (Dramatiq's ``join``) need these few statements over whole kinds. They take
the queue for its table, pool and clock and send only named statements of ``queries.sql``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta

from .cron import like_escape
from .errors import InvalidInput
from .queue import DelayedQueue
from .timeutil import duration_ms
from .types import Envelope, StoredMessage
from .validate import validate_kind


def dead_letter(
    queue: DelayedQueue,
    deliveries: Iterable[Envelope | tuple[int, str]],
    to_kind: str,
    retention: timedelta | float,
    payloads: Sequence[bytes | None] | None = None,
) -> int:
    """Move held deliveries to ``to_kind`` (kept ``retention``, never polled); returns rows moved.

    Matched on (id, lock) like an ack: a delivery whose lease was lost is not moved.
    ``payloads`` (one per delivery, None keeps the stored one) record the final message.
    """
    deliveries = list(deliveries)
    if payloads is not None and len(payloads) != len(deliveries):
        raise InvalidInput("dead_letter: one payload (or None) per delivery")
    to_kind, retention_ms = validate_kind(to_kind), duration_ms(retention, what="retention")
    moved = 0
    for params in queue._by_pair(deliveries, payloads or [None] * len(deliveries)):
        params.update(payloads=params.pop("extra"), to_kind=to_kind, retention_ms=retention_ms,
                      now=queue._now_ms())
        moved += queue.db.execute(queue.queries["dead_letter"], params, relaxed=queue.relaxed)
    return moved


def expire(queue: DelayedQueue, kinds: Sequence[str]) -> int:
    """Delete the rows of kept kinds whose retention ended; returns how many."""
    params = {"kinds": [validate_kind(k) for k in kinds], "now": queue._now_ms()}
    return queue.db.execute(queue.queries["expire_kinds"], params) if kinds else 0


def count_all(queue: DelayedQueue, kinds: Sequence[str]) -> int:
    """Rows of these kinds including those in flight (``count_waiting`` leaves those out)."""
    row = queue.db.fetchone(queue.queries["count_all"],
                            {"kinds": [validate_kind(k) for k in kinds]})
    return int(row[0]) if row else 0


def list_kinds(queue: DelayedQueue, kinds: Sequence[str], limit: int = 100) -> list[StoredMessage]:
    """Rows of these kinds, newest first."""
    params = {"kinds": [validate_kind(k) for k in kinds], "limit": int(limit)}
    return [StoredMessage.from_row(r) for r in queue.db.fetchall(queue.queries["list_kinds"],
                                                                 params)]


def kinds_with_prefix(queue: DelayedQueue, prefix: str) -> list[str]:
    """Kinds present in the table that start with ``prefix`` (metacharacters are literal)."""
    rows = queue.db.fetchall(queue.queries["kinds_like"],
                             {"pattern": like_escape(prefix) + "%"})
    return sorted(r[0] for r in rows)
