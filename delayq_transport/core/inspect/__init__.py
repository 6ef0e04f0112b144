"""Inspection: reading a queue table as an operator does, at a cost that does not grow with it.

Keyset listings, one task by key, cancel and reschedule by hand, the timeline and overview of
``delayq tasks`` and the web page (:mod:`.inspector`); text search over task arguments, a
bounded scan or an opt-in trigram index (:mod:`.search`); what holds back cleanup, read from
the catalogs (:mod:`.health`, ``delayq status`` and the metrics); whole-table reads in id order
for bulk readers such as Spark (:mod:`.scan`). Its statements are ``inspect.sql``. It stands
on the queue; nothing below it imports it.
"""

from __future__ import annotations

from .health import Health, check_health
from .inspector import MAX_MS, MIN_MS, Inspector, TaskRow
from .scan import SCAN_PAGE_ROWS, ScannedRow, id_bounds, scan_range
from .search import create_index, drop_index, index_ready, indexed_window, may_match, plain_piece

__all__ = [
    "MAX_MS",
    "MIN_MS",
    "SCAN_PAGE_ROWS",
    "Health",
    "Inspector",
    "ScannedRow",
    "TaskRow",
    "check_health",
    "create_index",
    "drop_index",
    "id_bounds",
    "index_ready",
    "indexed_window",
    "may_match",
    "plain_piece",
    "scan_range",
]
