"""Counts that stay fast (issue 10, part 4): kombu's queue size and ``delayq status`` read a
bounded number of index entries whatever the table holds, on a freshly bulk-loaded table (no
statistics yet, the case where the planner chose a bitmap scan of the whole kind) and after
ANALYZE. A few hundred thousand rows keep the test affordable; the guard is size-independent:
each statement's plan walks an index (no seq/bitmap scan, no sort, no JIT) and EXPLAIN ANALYZE
shows it touched a small, fixed number of pages;
test_reads_at_size.py checks every read of the status and the web page at 2M rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from delayq_transport import DelayedQueue
from delayq_transport.cli import main

FAR_ROWS = 300_000
DUE_ROWS = 25_000
CAP = 10_000
NOW_MS = 4_000_000_000_000  # an injected clock: rows below are due, rows above are not


class Clock:
    def __call__(self) -> Any:
        from delayq_transport.core.queue import from_ms

        return from_ms(NOW_MS)


def _bulk_load(url: str) -> None:
    """What a Spark job does: millions of rows in one go, no ANALYZE afterwards."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE delayed_queue DISABLE TRIGGER USER")
        conn.execute(
            """INSERT INTO delayed_queue ("pKey", "pKind", payload, "scheduledAt",
                                          "scheduledAtInitially", "createdAt")
               SELECT lpad(g::text, 10, '0'), 'celery', '\\x00'::bytea, t, t, 0
               FROM generate_series(1, %(n)s) AS g,
                    LATERAL (SELECT CASE WHEN g <= %(due)s THEN %(now)s - 1000 - g
                                         ELSE %(now)s + 3600000 + g END AS t) AS s""",
            {"n": FAR_ROWS + DUE_ROWS, "due": DUE_ROWS, "now": NOW_MS})
        conn.execute("ALTER TABLE delayed_queue ENABLE TRIGGER USER")
        conn.execute("ALTER TABLE delayed_queue SET (autovacuum_enabled = false)")


@pytest.fixture(scope="module")
def big_url(template_db: str) -> Iterator[str]:
    from conftest import template_copy

    with template_copy(template_db, prefix="delayq_big") as url:
        _bulk_load(url)
        yield url


@pytest.fixture
def big(big_url: str) -> Iterator[DelayedQueue]:
    with DelayedQueue(big_url, kind="celery", clock=Clock()) as q:
        yield q


def _explain(q: DelayedQueue, name: str, params: dict[str, Any]) -> dict[str, Any]:
    with psycopg.connect(q.db.url, autocommit=True) as conn, conn.transaction():
        conn.execute(q.queries["count_plan_guard"])
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q.queries[name],
                           params).fetchone()
    assert row is not None
    return row[0][0]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _assert_bounded(explained: dict[str, Any], max_pages: int) -> None:
    nodes = list(_nodes(explained["Plan"]))
    types = {n["Node Type"] for n in nodes}
    assert not types & {"Seq Scan", "Bitmap Heap Scan", "Sort"}, types
    assert types & {"Index Scan", "Index Only Scan"}, types
    assert "JIT" not in explained
    plan = explained["Plan"]
    pages = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
    assert pages <= max_pages, f"{pages} pages touched, the bound is {max_pages}"


def _table_pages(q: DelayedQueue) -> int:
    row = q.db.fetchone("SELECT pg_relation_size('delayed_queue') / 8192")
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh-load", "analyzed"])
def test_counts_walk_an_index_and_stop_at_the_cap(big: DelayedQueue, analyzed: bool) -> None:
    if analyzed:
        big.db.execute("ANALYZE delayed_queue")
    pages = _table_pages(big)
    params = {"kinds": ["celery", "celery\x06\x163"], "cap": CAP, "now": NOW_MS}
    # CAP due entries plus their heap pages: a fraction of the table, whatever it holds.
    _assert_bounded(_explain(big, "count_due", params), max_pages=pages // 10)
    _assert_bounded(_explain(big, "status_capped", params), max_pages=pages // 5)
    _assert_bounded(_explain(big, "status_in_flight", params), max_pages=20)


def test_capped_counts_are_labelled(big: DelayedQueue) -> None:
    big.db.execute("ANALYZE delayed_queue")
    assert big.count_due(cap=CAP) == CAP
    assert big.count_due(cap=DUE_ROWS + 1) == DUE_ROWS, "exact below the cap"
    (status,) = big.status(cap=CAP)
    assert (status.due, status.due_accuracy) == (CAP, "at least")
    assert status.scheduled_accuracy == "estimate"
    assert abs(status.scheduled - FAR_ROWS) < 0.2 * FAR_ROWS, status
    (exact,) = big.status(exact=True)
    assert (exact.due, exact.scheduled) == (DUE_ROWS, FAR_ROWS)
    (roomy,) = big.status(cap=FAR_ROWS + 1)
    assert (roomy.due, roomy.scheduled, roomy.due_accuracy, roomy.scheduled_accuracy) == (
        DUE_ROWS, FAR_ROWS, "exact", "exact")


def test_status_cli_reads_the_big_table(big_url: str) -> None:
    result = CliRunner().invoke(main, ["-d", big_url, "status", "--json"])
    assert result.exit_code == 0, result.output
    (celery,) = json.loads(result.output)["queues"]
    # The command's clock is the database's (decades before NOW_MS): every row is ahead.
    assert (celery["due"], celery["due_accuracy"]) == (0, "exact")
    assert celery["scheduled"] >= 100_000 and celery["scheduled_accuracy"] != "exact"
