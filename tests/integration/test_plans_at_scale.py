"""Plan cliffs on big tables (issue 10): every hot statement, as delayq's own pools run it
(generic plans on the consumer pool, custom plans on the other, ``jit=off`` on both), stays on
its index on a table the planner believes holds 10M rows, and on a freshly bulk-loaded table
that was never analyzed; and no statement of delayq's JIT-compiles even when the database
would JIT everything.

The 10M-row table is simulated in a second: 50k real rows, analyzed, then ``reltuples``
scaled so the planner sees 10M rows over the same pages (it multiplies the density by the
table's actual size). The ``scale`` scenario of ``bench/run.py`` measures the real thing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from _prepared import explain_prepared
from conftest import template_copy
from test_schema import plan_nodes

from delayq_transport import Database
from delayq_transport.core.db.queries import Queries

TABLE = "delayed_queue"
BY_KIND = f"{TABLE}__KindPlusScheduledAtIndex"
BY_LOCK = f"{TABLE}__LockUuidPlusIdIndex"
#: (id, lock) pairs: either index is bounded (``lockUuid = ANY`` and ``id = ANY`` both bound it).
BY_PAIR = f"{BY_LOCK}|{TABLE}_pkey"
BY_KEY = f"{TABLE}__PKeyPlusKindUniqueIndex"

#: statement -> (index its plan must use, runs on the relaxed (generic-plan) pool)
HOT: dict[str, tuple[str, bool]] = {
    "try_poll_many": (BY_KIND, True),
    "probe_below_watermark": (BY_KIND, True),
    "ack": (BY_LOCK, True),
    "ack_many": (BY_PAIR, True),
    "extend_lease": (BY_LOCK, True),
    "release": (BY_PAIR, True),
    "next_due": (BY_KIND, False),
    "offer_insert": (BY_KEY, False),
    "offer_batch_insert": (BY_KEY, False),
    "offer_select_for_update": (BY_KEY, False),
    "offer_cas_update": (BY_KEY, False),
    "once_identical": (BY_KEY, False),
}
PARAMS: dict[str, Any] = {
    "kinds": ["test", "other"], "lows": [None, 1000], "starts": [None, 500],
    "floors": [2000, 1000], "want_next": True,
    "limit": 8, "lock": "L", "lease_ms": 60_000, "now": None, "id": 5, "ids": [1, 2, 3],
    "locks": ["a", "b", "c"], "lock_set": ["a", "b", "c"],
    "delay_ms": 0, "key": "k5", "kind": "test", "payload": b"x", "scheduled_at": None,
    "expected_initially": 0, "expected_created": 0, "keys": ["n1", "k7"],
    "payloads": [b"x", b"y"], "ats": [1, 2], "min_lead_ms": None,
    "announce": True, "pending": ["test:1"], "max_listed": 1000,
}
LOAD = f"""
    INSERT INTO {TABLE} ("pKey", "pKind", payload, "scheduledAt", "scheduledAtInitially",
                         "createdAt")
    SELECT 'k' || i, CASE WHEN i % 5 = 0 THEN 'other' ELSE 'test' END, '\\x00', t, t, 0
    FROM generate_series(1, 50000) AS i,
         LATERAL (SELECT CASE WHEN i <= 5 THEN 1000 ELSE 9e15::bigint + i END AS t) AS s
"""


@pytest.fixture(scope="module", params=["analyzed_10M", "never_analyzed"])
def big_table(request: pytest.FixtureRequest, template_db: str) -> Iterator[str]:
    with template_copy(template_db, prefix="delayq_plans") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            dbname = conn.info.dbname
            # Make every plan JIT unless the session turns JIT off: the guard must be able to fail.
            conn.execute(f'ALTER DATABASE "{dbname}" SET jit_above_cost = 0')
            conn.execute(f'ALTER TABLE {TABLE} SET (autovacuum_enabled = false)')
            conn.execute(LOAD)
            if request.param == "analyzed_10M":
                conn.execute(f"ANALYZE {TABLE}")
                conn.execute("""UPDATE pg_class SET reltuples = reltuples * 200
                                WHERE oid = ANY(ARRAY[%s::regclass, %s::regclass, %s::regclass,
                                                      %s::regclass])""",
                             [TABLE, f'"{BY_KIND}"', f'"{BY_LOCK}"', f'"{BY_KEY}"'])
        yield url


def explain(conn: psycopg.Connection[Any], query: str, mode: str) -> dict[str, Any]:
    return explain_prepared(conn, query, mode, PARAMS)


def indexes_used(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    nodes = list(plan_nodes(plan["Plan"]))
    used = [(n["Node Type"], n.get("Index Name")) for n in nodes
            if n.get("Relation Name") == TABLE or n.get("Index Name", "").startswith(TABLE)]
    used += [("Arbiter", name) for n in nodes for name in n.get("Conflict Arbiter Indexes", [])]
    return used


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("statement", sorted(HOT))
def test_hot_statements_stay_on_their_index_without_jit(big_table: str, statement: str,
                                                        mode: str) -> None:
    index, relaxed = HOT[statement]
    with Database(big_table, max_size=1) as db:
        pool = db.relaxed_pool if relaxed else db.pool
        with pool.connection() as conn:
            assert conn.execute("SHOW jit").fetchone() == ("off",)
            plan = explain(conn, Queries(TABLE)[statement], mode)
    used = indexes_used(plan)
    assert "JIT" not in plan, json.dumps(plan, indent=1)
    assert not any(node == "Seq Scan" for node, _ in used), json.dumps(plan, indent=1)
    assert any(name in index.split("|") for _, name in used), used


def test_the_jit_guard_can_fail(big_table: str) -> None:
    """Control: a plain session of the same database does JIT-compile the poll."""
    with psycopg.connect(big_table, autocommit=True) as conn:
        plan = explain(conn, Queries(TABLE)["try_poll_many"], "force_generic_plan")
    assert "JIT" in plan
