"""Counts that stay fast on big tables: exact up to a cap, labelled estimates beyond it.

An exact ``count(*)`` reads every row it counts: 0.6-2.9 s for kombu's queue size and 3.2-3.5 s
for ``delayq status`` at 5M rows. Here every count walks its index in order and stops at a cap
(:data:`COUNT_CAP`), so its cost is bounded whatever the table holds:

* **due** (kombu's ``message_count``, what a Celery user sees "in the queue"): rows whose
  ``scheduledAt`` has passed, expired leases included. Exact up to the cap, else "at least cap".
* **scheduled** (far-future rows): exact up to the cap; beyond it an *estimate* from the
  statistics PostgreSQL already keeps (``pg_stat_user_tables.n_live_tup`` and the kind's share
  in ``pg_stats``), or "at least cap" when the table was never analyzed and holds several kinds.
* **in flight**: rows under a live lease, exact (they are few: workers x prefetch), capped.

``delayq status --exact`` (``status(exact=True)``) still runs the full count when wanted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from ..db.database import cursor_of
from .types import KindOverview, KindStatus, TableStats

if TYPE_CHECKING:
    from .handle import QueueHandle

#: Most rows any one count reads (per kind and per measure). ~0.1-0.2 s at the cap on this
#: machine, whatever the table size; above it counts are labelled "at least" or estimates.
COUNT_CAP = 100_000

#: scheduledAt's smallest value (inspect.MIN_MS): "since ever".
_NO_LOWER_BOUND_MS = -(2**63)

EXACT = "exact"
AT_LEAST = "at least"
ESTIMATE = "estimate"


def bounded_read(queue: QueueHandle, name: str, params: dict[str, Any]
                 ) -> list[tuple[Any, ...]]:
    """Rows of the read statement ``name``, run as every count is: in a transaction opened
    with ``count_plan_guard``, so it walks its index and stops at its LIMIT whatever the
    planner believes.

    What ``delayq tasks``, the web page and the status read from the queue table is a bounded
    index walk by design, on the plain pool, whose plans are otherwise left to the statistics:
    with 5M rows due over the next day and none due yet, the overview's due count (``now``
    unknown to the planner, a third of the rows expected to match, the LIMIT expected to stop
    a scan early) read all 5M rows in a sequential scan, 3.7 s. A seq scan, a bitmap scan or a
    sort never serves these reads, so they are off for each of them, as for the relaxed pool.
    """
    q = queue.queries

    def work(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        with conn.transaction():
            cursor_of(conn).execute(q["count_plan_guard"])
            return cursor_of(conn).execute(q[name], params).fetchall()

    return queue.db.run(work)


def count_due(queue: QueueHandle, kinds: Sequence[str], cap: int = COUNT_CAP) -> int:
    """Due rows of ``kinds``, exact up to ``cap`` (returns ``cap`` when there are more)."""
    params = {"kinds": list(kinds), "cap": int(cap), "now": queue.clock_ms()}

    def work(conn: psycopg.Connection[Any]) -> int:
        with conn.transaction():
            conn.execute(queue.queries["count_plan_guard"])
            row = conn.execute(queue.queries["count_due"], params).fetchone()
        return int(row[0]) if row else 0

    return queue.db.run(work)


def capped_status(queue: QueueHandle, cap: int = COUNT_CAP) -> list[KindStatus]:
    """Per-kind counters with every count bounded by ``cap`` (see the module docstring)."""
    q = queue.queries
    params = {"cap": int(cap), "now": queue.clock_ms()}

    def work(conn: psycopg.Connection[Any]) -> tuple[list[Any], dict[str, int], Any]:
        with conn.transaction():
            conn.execute(q["count_plan_guard"])
            rows = conn.execute(q["status_capped"], params).fetchall()
            flying = dict(conn.execute(q["status_in_flight"], params).fetchall())
            estimates = conn.execute(q["status_estimates"]).fetchone()
        return rows, flying, estimates

    rows, flying, estimates = queue.db.run(work)
    shares = _kind_shares(estimates, [r[0] for r in rows])
    total = _live_rows_estimate(estimates)
    return [_kind_status(r, flying.get(r[0], 0), cap, shares, total) for r in sorted(rows)]


def kind_row_estimates(queue: QueueHandle, kinds: Sequence[str]) -> dict[str, int]:
    """Estimated live rows of each kind from the statistics alone (nothing reads the table):
    what a capped count is shown as, marked as an estimate. Empty when nothing is known."""
    kinds = list(kinds)
    if not kinds:
        return {}
    estimates = queue.db.fetchone(queue.queries["status_estimates"])
    total = _live_rows_estimate(estimates)
    if total is None:
        return {}
    return {k: round(total * share) for k, share in _kind_shares(estimates, kinds).items()}


def past_the_cap(k: KindOverview, rows: int | None, stats: TableStats, cap: int
                 ) -> tuple[int, int]:
    """(due, scheduled) of one kind: counts that reached the cap are replaced by
    the statistics' estimate (the kind's rows split at now by the scheduledAt histogram)
    when that is larger; a count below the cap is exact and kept."""
    due, scheduled = k.due, k.scheduled
    if rows is None or cap not in (k.due, k.later):
        return due, scheduled
    total = max(stats.rows_estimate, stats.live_estimate, 1)
    due_share = min(stats.estimate_between(_NO_LOWER_BOUND_MS, k.now_ms + 1) / total, 1.0)
    if k.due >= cap:
        due = max(due, round(rows * due_share))
    if k.later >= cap:
        scheduled = max(scheduled, rows - due - k.in_flight)
    return due, scheduled


def _kind_status(row: tuple[Any, ...], in_flight: int, cap: int,
                 shares: dict[str, float], total: float | None) -> KindStatus:
    kind, due, due_redelivered, lag, scheduled, sched_redelivered, next_at = row
    due_accuracy = AT_LEAST if due >= cap else EXACT
    scheduled_accuracy = EXACT
    if scheduled >= cap:
        scheduled_accuracy = AT_LEAST
        share = shares.get(kind)
        if share is not None and total is not None:
            estimate = int(total * share) - due - in_flight
            if estimate > scheduled:
                scheduled, scheduled_accuracy = estimate, ESTIMATE
    return KindStatus(kind, int(due), int(scheduled), int(in_flight),
                      int(due_redelivered + sched_redelivered), lag, next_at,
                      due_accuracy, scheduled_accuracy)


def _live_rows_estimate(estimates: Any) -> float | None:
    """Live rows of the table now: the cumulative statistics' count, else the planner's density
    (reltuples/relpages) times the current number of pages, as the planner estimates it."""
    if estimates is None:
        return None
    reltuples, relpages, pages_now, live = estimates[:4]
    if live is not None and live > 0:
        return float(live)
    if reltuples is not None and reltuples >= 0 and relpages:
        return float(reltuples) / relpages * pages_now
    return None


def _kind_shares(estimates: Any, kinds: list[str]) -> dict[str, float]:
    """Each kind's fraction of the rows, from pg_stats' most common values (last ANALYZE).

    Kinds missing from the list share what is left evenly, as the planner assumes. Without
    statistics a table holding a single kind is all that kind; otherwise nothing is known.
    """
    values, freqs, n_distinct, null_frac = (estimates or (None,) * 8)[4:8]
    if not values or not freqs:
        return {kinds[0]: 1.0} if len(kinds) == 1 else {}
    known = dict(zip(values, freqs, strict=False))
    distinct = n_distinct if n_distinct and n_distinct > 0 else len(kinds)
    others = max(distinct - len(known), 1)
    rest = max(1.0 - sum(known.values()) - (null_frac or 0.0), 0.0) / others
    return {k: known.get(k, rest) for k in kinds}
