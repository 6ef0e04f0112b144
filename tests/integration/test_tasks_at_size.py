"""At size: with 2M rows the list, filter, overview and timeline statements stay on the
(pKind, scheduledAt) / lockUuid indexes (EXPLAIN) and every service call answers quickly.

The rows are built with generate_series in a few seconds; the 5M-row figures per endpoint are
in bench/bench_web.py and docs/benchmarks.md.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from delayq_transport import DelayedQueue
from delayq_transport.core.inspect import MAX_MS, MIN_MS
from delayq_transport.tasks import TaskFilter, TaskService

pytestmark = pytest.mark.slow

ROWS = 2_000_000
KINDS = ["celery", "celery\x06\x163", "mail", "reports"]
#: Generous for a shared 2-core CI machine; the bench holds the < 300 ms target at 5M.
CALL_BUDGET_S = 1.5


#: A valid Celery message cut to the fields the list decodes (a full one is ~900 bytes, which
#: made building the table I/O-bound).
SMALL_PAYLOAD = json.dumps({
    "body": base64.b64encode(b'[[{"user": 1}], {}, {}]').decode(), "content-type":
    "application/json", "headers": {"task": "app.remind", "id": "x"},
    "properties": {"body_encoding": "base64", "priority": 0}}).encode()
INDEXES = """SELECT indexdef FROM pg_indexes
               WHERE tablename = 'delayed_queue' AND indexname LIKE '%%Index'"""


def build(url: str) -> int:
    """ROWS rows over 4 kinds, due from an hour ago to 30 days ahead, 50 in flight (leases
    of a day, so they are still live when the tests run).

    Fast on a busy machine: an unlogged table, indexes dropped during the insert and rebuilt
    after (the same definitions), notify triggers off."""
    payload = SMALL_PAYLOAD
    with psycopg.connect(url, autocommit=True) as conn:
        now = conn.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()[0]
        indexes = [r[0] for r in conn.execute(INDEXES)]
        conn.execute("ALTER TABLE delayed_queue SET UNLOGGED")
        conn.execute("ALTER TABLE delayed_queue DISABLE TRIGGER USER")
        for index in indexes:
            conn.execute("DROP INDEX " + index.split(" INDEX ")[1].split(" ON ")[0])
        conn.execute(
            """INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",
                                          "scheduledAtInitially", "createdAt")
               SELECT 'k' || g, (%(kinds)s::text[])[1 + g %% 4], %(payload)s,
                      %(now)s - 3600000 + (g::bigint * 1297) %% 2592000000,
                      %(now)s - 3600000 + (g::bigint * 1297) %% 2592000000, %(now)s
               FROM generate_series(1, %(rows)s) AS g""",
            {"kinds": KINDS, "payload": payload, "now": now, "rows": ROWS})
        conn.execute("SET maintenance_work_mem = '256MB'")
        for index in indexes:
            conn.execute(index)
        conn.execute("""UPDATE delayed_queue SET "lockUuid" = 'lock-' || id,
                        "scheduledAt" = %(now)s + 86400000 WHERE id <= 50""", {"now": now})
        conn.execute("ALTER TABLE delayed_queue ENABLE TRIGGER USER")
        conn.execute("VACUUM ANALYZE delayed_queue")
    return now


@pytest.fixture(scope="module")
def big(template_db: str) -> Iterator[tuple[str, int]]:
    from tests.conftest import template_copy

    with template_copy(template_db, prefix="delayq_t12big") as url:
        yield url, build(url)


def plan(url: str, statement: str, params: dict[str, Any], generic: bool) -> dict[str, Any]:
    """The custom plan, or the generic one a pooled connection settles on after a few calls."""
    from tests.integration.test_schema import generic_plan

    with DelayedQueue(url, ensure_schema=False) as q, psycopg.connect(url) as conn:
        if generic:
            conn.autocommit = True
            return generic_plan(conn, q.queries[statement], params)
        text = "EXPLAIN (FORMAT JSON) " + q.queries[statement]
        return conn.execute(text, params).fetchone()[0][0]["Plan"]


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def scans(node: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(n["Node Type"], n.get("Index Name")) for n in nodes(node)
            if n.get("Relation Name") == "delayed_queue"]


WINDOW = {"kinds": KINDS, "after_at": MIN_MS, "after_id": MIN_MS, "lo": MIN_MS, "hi": MAX_MS,
          "budget": 1000, "with_payload": False, "now": None}


@pytest.mark.parametrize("statement, params", [
    ("inspect_window", WINDOW),
    ("inspect_window", dict(WINDOW, after_at=10**13, after_id=5, lo=10**12)),
    ("inspect_overview", {"kinds": KINDS, "cap": 5000, "redelivered_cap": 1000, "now": None}),
    ("inspect_timeline", {"kinds": KINDS, "los": [0, 10**12], "his": [10**12, 10**13],
                          "cap": 2000}),
    ("inspect_kinds", {"limit": 500}),
    ("inspect_held", {"kinds": KINDS, "after_at": MIN_MS, "after_id": MIN_MS, "budget": 100,
                      "now": None}),
    ("inspect_by_key", {"key": "k77", "now": None}),
    ("dead_letters_page", {"kinds": KINDS, "before_at": MAX_MS, "before_id": MAX_MS,
                           "limit": 51, "now": None}),
    ("dead_letters_count", {"kinds": KINDS, "cap": 10_000}),
    ("leases_held", {"cap": 10_000, "now": None}),
])
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_list_and_filter_statements_stay_on_an_index(big: tuple[str, int], statement: str,
                                                      params: dict[str, Any],
                                                      generic: bool) -> None:
    on_table = scans(plan(big[0], statement, params, generic))
    assert on_table, statement
    assert all(kind != "Seq Scan" for kind, _ in on_table), json.dumps(on_table)
    assert all(name for _, name in on_table if "Index" in _), on_table


def test_every_service_call_is_fast_at_size(big: tuple[str, int]) -> None:
    url, now = big
    with DelayedQueue(url, ensure_schema=False) as q:
        svc = TaskService(q)
        calls = {
            "list": lambda: svc.list_page(TaskFilter(), limit=50),
            "list queue": lambda: svc.list_page(TaskFilter.parse(queue="mail"), limit=50),
            "list state=due": lambda: svc.list_page(TaskFilter.parse(state="due")),
            "list in flight": lambda: svc.list_page(TaskFilter.parse(state="in_flight")),
            "search args": lambda: svc.list_page(TaskFilter.parse(text="nobody-has-this")),
            "task name": lambda: svc.list_page(TaskFilter.parse(task="app.*")),
            "show": lambda: svc.find("k123456"),
            "overview": svc.overview,
            "timeline 24h": lambda: svc.timeline(24, 48),
            "timeline 7d": lambda: svc.timeline(168, 56),
        }
        timings = {}
        for name, call in calls.items():
            call()  # warm the pool and the plan cache
            start = time.perf_counter()
            call()
            timings[name] = time.perf_counter() - start
        assert len(svc.list_page(TaskFilter.parse(state="in_flight")).items) == 50
        t = svc.timeline(24 * 7, 56)
        assert any(t.estimated) and sum(t.counts) > ROWS // 10  # estimated, not counted
    slow = {k: round(v, 3) for k, v in timings.items() if v > CALL_BUDGET_S}
    assert not slow, (slow, timings)
