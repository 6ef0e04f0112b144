"""Whole-partition operations: dead letters, retention, counts and listings over kinds.

``DelayedQueue`` is about one message at a time; adapters that keep rows no consumer polls
(Dramatiq's dead letters, kept under a kind of their own with a retention) or that wait for a
queue to be empty (Dramatiq's ``join``) need these few statements over whole kinds. They take
the queue for its table, pool and clock and send only named statements of ``queue.sql``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from ..db.errors import InvalidInput
from .counts import bounded_read
from .delayed_queue import DelayedQueue
from .timeutil import duration_ms
from .types import Envelope, StoredMessage
from .validate import like_escape, validate_kind


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
                      now=queue.clock_ms())
        moved += queue.db.execute(queue.queries["dead_letter"], params, relaxed=queue.relaxed)
    return moved


def expire(queue: DelayedQueue, kinds: Sequence[str]) -> int:
    """Delete the rows of kept kinds whose retention ended; returns how many."""
    params = {"kinds": [validate_kind(k) for k in kinds], "now": queue.clock_ms()}
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


def kinds_ending(queue: DelayedQueue, suffix: str) -> list[str]:
    """Kinds present in the table that end in ``suffix`` (metacharacters are literal)."""
    rows = queue.db.fetchall(queue.queries["kinds_ending"],
                             {"pattern": "%" + like_escape(suffix)})
    return sorted(r[0] for r in rows)


# -- dead letters as the web page and the CLI manage them ----------------------------------


def dead_letters_page(queue: DelayedQueue, kinds: Sequence[str], before: tuple[int, int],
                      limit: int) -> list[Any]:
    """Rows (``inspect.TaskRow`` columns) of these kept kinds, newest first, after the keyset
    cursor ``before`` = (scheduledAt, id), at most ``limit``."""
    if not 1 <= limit <= 1000:
        raise InvalidInput(f"limit must be 1..1000, got {limit}")
    params = {"kinds": [validate_kind(k) for k in kinds], "before_at": int(before[0]),
              "before_id": int(before[1]), "limit": int(limit), "now": queue.clock_ms()}
    return bounded_read(queue, "dead_letters_page", params) if kinds else []


def dead_letters_count(queue: DelayedQueue, kinds: Sequence[str], cap: int) -> dict[str, int]:
    """Rows per kept kind, each count stopping at ``cap``."""
    if not kinds:
        return {}
    rows = bounded_read(queue, "dead_letters_count",
                        {"kinds": [validate_kind(k) for k in kinds], "cap": int(cap)})
    return {r[0]: int(r[1]) for r in rows}


def requeue_dead_letter(queue: DelayedQueue, row_id: int, from_kind: str, to_kind: str,
                        payload: bytes) -> int | None:
    """Move one dead letter to ``to_kind``, due now, with ``payload``; its new scheduledAt, or
    None if it is no longer a dead letter of ``from_kind`` (requeued or deleted meanwhile)."""
    params = {"id": int(row_id), "from_kind": validate_kind(from_kind),
              "to_kind": validate_kind(to_kind), "payload": payload, "now": queue.clock_ms()}
    row = queue.db.fetchone(queue.queries["dead_letter_requeue"], params)
    if row is not None:
        queue._lower(to_kind, int(row[1]))
    return None if row is None else int(row[1])


def delete_dead_letters(queue: DelayedQueue, ids: Sequence[int], kinds: Sequence[str]
                        ) -> list[int]:
    """Delete these ids, only where they are rows of the kept ``kinds``; returns ids deleted."""
    if not ids or not kinds:
        return []
    params = {"ids": [int(i) for i in ids], "kinds": [validate_kind(k) for k in kinds]}
    return [int(r[0]) for r in queue.db.fetchall(queue.queries["dead_letter_delete"], params)]
