"""Whole-table reads in id order, for bulk readers (Spark's ``queue_dataframe``).

Split by id range and paged by keyset inside each range, so readers can run in parallel and
no statement returns an unbounded result. Row states follow the ``status`` statement: an
expired lease counts as due and redelivered. Pages carry no payload, only the Celery task
name (``scan_page_tasks``): a reader of millions of rows neither transfers nor parses ~1 KB
per row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from ..queue.delayed_queue import DelayedQueue

#: Rows per keyset page: large enough to amortise a round trip, small enough to bound memory.
SCAN_PAGE_ROWS = 20_000


class ScanBounds(NamedTuple):
    lo: int
    hi: int  # inclusive
    now_ms: int


class ScannedRow(NamedTuple):
    id: int
    key: str
    kind: str
    task: str | None
    scheduled_at_ms: int
    scheduled_at_initially_ms: int
    created_at_ms: int
    in_flight: bool
    redelivered: bool


def id_bounds(queue: DelayedQueue) -> ScanBounds | None:
    """Smallest and largest id of the table (None when it is empty), and the database time."""
    row = queue.db.fetchone(queue.queries["scan_bounds"], {"now": queue.clock_ms()})
    if row is None or row[0] is None:
        return None
    return ScanBounds(int(row[0]), int(row[1]), int(row[2]))


def scan_page(queue: DelayedQueue, lo: int, hi: int, limit: int) -> list[ScannedRow]:
    """Up to ``limit`` rows with ``lo <= id < hi`` in id order; continue from the last id + 1."""
    params = {"lo": lo, "hi": hi, "limit": limit, "now": queue.clock_ms()}
    return [ScannedRow(*r) for r in queue.db.fetchall(queue.queries["scan_page_tasks"], params)]


def scan_range(
    queue: DelayedQueue, lo: int, hi: int, page_rows: int = SCAN_PAGE_ROWS
) -> Iterator[list[ScannedRow]]:
    """Every row with ``lo <= id < hi``, page by page (keyset, ``page_rows`` per statement)."""
    while lo < hi:
        rows = scan_page(queue, lo, hi, page_rows)
        if rows:
            yield rows
        if len(rows) < page_rows:
            return
        lo = rows[-1].id + 1
