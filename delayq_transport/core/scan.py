"""Whole-table reads in id order, for bulk readers (Spark's ``queue_dataframe``).

Split by id range and paged by keyset inside each range, so readers can run in parallel and
no statement returns an unbounded result. Row states follow the ``status`` statement: an
expired lease counts as due and redelivered.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .queue import DelayedQueue


class ScanBounds(NamedTuple):
    lo: int
    hi: int  # inclusive
    now_ms: int


class ScannedRow(NamedTuple):
    id: int
    key: str
    kind: str
    payload: bytes
    scheduled_at_ms: int
    scheduled_at_initially_ms: int
    created_at_ms: int
    in_flight: bool
    redelivered: bool


def id_bounds(queue: DelayedQueue) -> ScanBounds | None:
    """Smallest and largest id of the table (None when it is empty), and the database time."""
    row = queue.db.fetchone(queue.queries["scan_bounds"], {"now": queue._now_ms()})
    if row is None or row[0] is None:
        return None
    return ScanBounds(int(row[0]), int(row[1]), int(row[2]))


def scan_page(queue: DelayedQueue, lo: int, hi: int, limit: int) -> list[ScannedRow]:
    """Up to ``limit`` rows with ``lo <= id < hi`` in id order; continue from the last id + 1."""
    params: dict[str, Any] = {"lo": lo, "hi": hi, "limit": limit, "now": queue._now_ms()}
    return [ScannedRow(*r) for r in queue.db.fetchall(queue.queries["scan_page"], params)]
