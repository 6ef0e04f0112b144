"""The claim of a controlled queue (the function of migration 21, core/queue/controls.py) stays
on the queue table's indexes at 5M waiting rows: every statement it runs inside, as auto_explain
shows them (nested statements included), under generic and custom plans, on the consumer pool's
settings. The 5M rows are simulated as test_plans_at_scale.py does: 50k real rows (countdowns
far ahead, a few due), analyzed, ``reltuples`` scaled so the planner sees 5M."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import template_copy
from test_schema import plan_nodes

from delayq_transport import Database, DelayedQueue
from delayq_transport.core.queue import set_control

TABLE = "delayed_queue"
BY_KIND = f"{TABLE}__KindPlusScheduledAtIndex"
LOAD = f"""
    INSERT INTO {TABLE} ("pKey", "pKind", payload, "scheduledAt", "scheduledAtInitially",
                         "createdAt")
    SELECT 'k' || i, CASE WHEN i % 10 = 0 THEN 'other' ELSE 'mail' END,
           convert_to('{{"headers": {{"delayq_limit_key": "c' || (i % 7) || '"}}}}', 'UTF8'),
           t, t, 0
    FROM generate_series(1, 50000) AS i,
         LATERAL (SELECT CASE WHEN i <= 40 THEN 1000 ELSE 9e15::bigint + i END AS t) AS s
"""
CLAIM = (f"SELECT * FROM {TABLE}__claim_controlled('mail', ARRAY['mail'], "
         "ARRAY['headers.delayq_limit_key'], 5, %s, 60000, NULL, true, 50, 200, 100)")


@pytest.fixture(scope="module")
def five_million(template_db: str) -> Iterator[str]:
    with template_copy(template_db, prefix="delayq_ctl") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
            conn.execute(LOAD)
            conn.execute(f"ANALYZE {TABLE}")
            conn.execute("UPDATE pg_class SET reltuples = reltuples * 100 WHERE oid = ANY("
                         "ARRAY(SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)"
                         " || %s::regclass)", [TABLE, TABLE])
        with DelayedQueue(url, kind="mail", pool_max_size=1) as queue:
            set_control(queue, "mail", concurrency=3, key_concurrency=1, rate="50/s",
                        key_rate="10/s")
        yield url


def nested_plans(conn: psycopg.Connection[Any], mode: str) -> list[dict[str, Any]]:
    """The plans of every statement one claim runs, inside the function too (auto_explain,
    loaded in this session only, its output sent to this client as notices)."""
    notes: list[str] = []
    conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    with conn.transaction(force_rollback=True):
        for setting in ("LOAD 'auto_explain'", "SET LOCAL auto_explain.log_min_duration = 0",
                        "SET LOCAL auto_explain.log_nested_statements = on",
                        "SET LOCAL auto_explain.log_format = json",
                        "SET LOCAL auto_explain.log_level = notice",
                        f"SET LOCAL plan_cache_mode = {mode}"):
            conn.execute(setting)
        for i in range(7):  # plpgsql's cached plans: custom ones first, then maybe generic
            taken = [r for r in conn.execute(CLAIM, [f"L{i}"]).fetchall() if r[0] is not None]
            assert len(taken) <= 3
    return [json.loads(n[n.index("{"):]) for n in notes if "{" in n]


@pytest.mark.slow
@pytest.mark.parametrize("held", [False, True], ids=["plain", "held_snapshot"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_the_controlled_claim_stays_on_the_queue_tables_indexes(five_million: str,
                                                                mode: str, held: bool) -> None:
    """Also under a held snapshot (a long transaction elsewhere), with the dead index entries
    of 2,000 tasks claimed and acked since it began at the low end of the kind."""
    with contextlib.ExitStack() as stack:
        if held:
            holder = stack.enter_context(psycopg.connect(five_million))
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM delayed_queue__controls")  # the snapshot
            with psycopg.connect(five_million, autocommit=True) as conn:
                conn.execute(f"""INSERT INTO {TABLE} ("pKey", "pKind", payload, "scheduledAt",
                                 "scheduledAtInitially", "createdAt")
                                 SELECT 'd' || i, 'mail', '\\x7b7d', 500, 500, 0
                                 FROM generate_series(1, 2000) AS i""")
                conn.execute(f"DELETE FROM {TABLE} WHERE \"pKey\" LIKE 'd%%'")
        with Database(five_million, max_size=1) as db, db.relaxed_pool.connection() as conn:
            plans = nested_plans(conn, mode)
    on_queue = []
    for plan in plans:
        nodes = list(plan_nodes(plan["Plan"]))
        used = [(n["Node Type"], n.get("Index Name")) for n in nodes
                if n.get("Relation Name") == TABLE]
        assert not any(node == "Seq Scan" for node, _ in used), json.dumps(plan, indent=1)
        on_queue += used
    assert ("Index Scan", BY_KIND) in on_queue, on_queue  # the due rows, in (kind, time) order
    assert any(name in (f"{TABLE}_pkey", f"{TABLE}__LockUuidPlusIdIndex")
               for _, name in on_queue)  # the slots' rows, by (lock, id) or id
    assert any(node == "Tid Scan" for node, _ in on_queue)  # the lease, by the rows' ctids
