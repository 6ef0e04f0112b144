"""Reading a whole queue table in parallel ranges (the Spark reader, reports over millions).

A reader splits ``[min(id), max(id)]`` into ranges and pages through each with keyset
queries, so no statement returns an unbounded result and ranges run on separate connections.
Rows come back without their payloads (only the Celery task name, ``scan_page_tasks``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .db import Database
from .queries import Queries

#: Rows per keyset page: large enough to amortise a round trip, small enough to bound memory.
SCAN_PAGE_ROWS = 20_000


def scan_bounds(db: Database, table: str) -> tuple[int, int] | None:
    """(lowest id, highest id) of the table, or None if it is empty."""
    row = db.fetchone(Queries(table)["scan_bounds"], {"now": None})
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1])


def scan_range(
    db: Database, table: str, lo: int, hi: int, page_rows: int = SCAN_PAGE_ROWS
) -> Iterator[list[tuple[Any, ...]]]:
    """Pages of rows with lo <= id < hi, in id order: (id, key, kind, task, scheduledAt,
    scheduledAtInitially, createdAt, in_flight, redelivered); times in epoch ms."""
    query = Queries(table)["scan_page_tasks"]
    while lo < hi:
        rows = db.fetchall(query, {"lo": lo, "hi": hi, "limit": page_rows, "now": None})
        if rows:
            yield rows
        if len(rows) < page_rows:
            return
        lo = rows[-1][0] + 1
