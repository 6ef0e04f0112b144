"""The statements the ``django.tasks`` backend and its workers run per task and per poll stay
on their index at size (issue 44): a big ``delayq_task_results`` and a big queue table of
``django:`` kinds, built with generate_series and analyzed, each statement planned as delayq
sends it (prepared, generic and custom plans, on the pool it runs on) under EXPLAIN (ANALYZE,
FORMAT JSON) in a transaction rolled back afterwards.

* per task: ``task_results_start`` (insert, or update on conflict, by (tableName, id)),
  ``task_results_finish`` (update by (tableName, id)), ``task_results_get`` (the result by its
  primary key and the queue row by (pKey, pKind)); ``task_results_touch`` (a worker's running
  attempts, by (tableName, id)) and ``task_results_interrupt`` (a given-back attempt);
* per poll: ``try_poll_many`` over a worker's ``django:`` kinds, ``task_kinds`` (the kinds
  that hold rows, a loose index scan);
* the failure lists and the admin's results (issue 50): ``task_results_walk`` (finished
  results newest first, by (tableName, finishedAt) backwards), ``task_results_walk_failed`` and
  ``task_results_failed_since`` (the failed ones, by the partial index of migration 19: one in
  2,000 results failed), ``task_results_by_ids`` (a page's results and their queue rows),
  ``task_results_discard`` and ``task_results_reopen`` (by primary key);
* planned on an empty table: ``task_results_start`` and ``task_results_finish``, their
  generic plans made while the results table was analyzed empty and kept as it grew to 1.1M;
* per prune: ``task_results_prune`` (finished before the retention, by (tableName,
  finishedAt)), in the steady state (a few results expired since the last prune among 1.1M
  kept) and after a backlog (most of a table expired at once, a retention just shortened),
  on delayq's pool and in a plain session: it stays on its index by its ORDER BY, not only by
  the relaxed pool's ``enable_seqscan = off``.

test_plans_at_scale.py covers the queue's other statements (ack, lease, offer) for every kind.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest
from _prepared import explain_prepared, prepared
from conftest import template_copy
from test_schema import plan_nodes

from delayq_transport import Database
from delayq_transport.core.db.queries import Queries

pytestmark = pytest.mark.slow

TABLE = "delayed_queue"
RESULTS = "delayq_task_results"
RESULTS_PK = f"{RESULTS}_pkey"
BY_FINISHED = f"{RESULTS}__finished"
FAILED = f"{RESULTS}__failed"
BY_KIND = f"{TABLE}__KindPlusScheduledAtIndex"
BY_KEY = f"{TABLE}__PKeyPlusKindUniqueIndex"
#: Results of this queue table (a tenth more belong to another one), and queue rows.
RESULT_ROWS = 1_000_000
QUEUE_ROWS = 400_000
DAY_MS = 86_400_000
RETENTION_MS = 7 * DAY_MS
#: A worker's kinds of queues default and mail at three priorities each (row g of the queue
#: table is of DJANGO_KINDS[g % 6]; a seventh of the rows are Celery's).
DJANGO_KINDS = [f"django:{queue}:{priority}" for queue in ("default", "mail")
                for priority in (10, 0, -5)]
NOW = 1_800_000_000_000


def build(url: str) -> None:
    """Both tables. Fast on a busy machine: unlogged, indexes dropped during the insert and
    rebuilt after (the same definitions), autovacuum off (analyzed by hand, as a table looks
    between autovacuums)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        for table in (TABLE, RESULTS):
            conn.execute(f"ALTER TABLE {table} SET UNLOGGED")
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        indexes = [r[0] for r in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexname LIKE '%%Index'",
            [TABLE])]
        for index in indexes:
            conn.execute("DROP INDEX " + index.split(" INDEX ")[1].split(" ON ")[0])
        conn.execute(f"ALTER TABLE {TABLE} DISABLE TRIGGER USER")
        conn.execute(
            f"""INSERT INTO {TABLE} ("pKey", "pKind", "payload", "scheduledAt",
                                     "scheduledAtInitially", "createdAt")
                SELECT md5('q' || g), CASE WHEN g %% 7 = 0 THEN 'celery'
                                           ELSE (%(kinds)s::text[])[1 + g %% 6] END,
                       '\\x7b7d', at, at, %(now)s
                FROM generate_series(1, %(rows)s) AS g,
                     LATERAL (SELECT %(now)s - %(day)s + (g::bigint * 7919) %% (2 * %(day)s))
                     AS a(at)""",
            {"kinds": DJANGO_KINDS, "now": NOW, "day": DAY_MS, "rows": QUEUE_ROWS})
        for index in indexes:
            conn.execute(index)
        conn.execute(f"""UPDATE {TABLE} SET "lockUuid" = 'lock-' || id,
                         "scheduledAt" = %(now)s + 60000 WHERE id <= 50""", {"now": NOW})
        conn.execute(f"ALTER TABLE {TABLE} ENABLE TRIGGER USER")

        result_indexes = [r[0] for r in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexname <> %s",
            [RESULTS, RESULTS_PK])]
        for index in result_indexes:
            conn.execute("DROP INDEX " + index.split(" INDEX ")[1].split(" ON ")[0])
        conn.execute(f"ALTER TABLE {RESULTS} DROP CONSTRAINT {RESULTS_PK}")
        insert_results(conn)
        conn.execute(f'ALTER TABLE {RESULTS} ADD CONSTRAINT {RESULTS_PK} '
                     f'PRIMARY KEY ("tableName", "id")')
        for index in result_indexes:
            conn.execute(index)
        conn.execute(f"ANALYZE {TABLE}")
        conn.execute(f"ANALYZE {RESULTS}")


def insert_results(conn: psycopg.Connection[Any]) -> None:
    """The results: finished over the retention's 7 days (what the prunes keep), one in 50 not
    finished (running, or READY while a retry waits), one in 1,500 expired since the last
    prune, one in 2,000 failed, a tenth of another queue table."""
    conn.execute(
        f"""INSERT INTO {RESULTS} ("tableName", "id", "task", "status", "enqueuedAt",
                                   "startedAt", "lastAttemptedAt", "finishedAt",
                                   "returnValue", "errors", "workerIds", "updatedAt")
            SELECT CASE WHEN g %% 10 = 0 THEN 'other_queue' ELSE %(table)s END,
                   md5('r' || g), '{{"task": "shop.djtasks.add"}}', s.status, at - 5,
                   at - 2, at - 2, CASE WHEN s.status = 'RUNNING' THEN NULL ELSE at END,
                   '3', '[]', '["w1"]', at
            FROM generate_series(1, %(rows)s) AS g,
                 LATERAL (SELECT CASE WHEN g %% 50 = 0 THEN 'RUNNING'
                                      WHEN g %% 2000 = 7 THEN 'FAILED'
                                      ELSE 'SUCCESSFUL' END) AS s(status),
                 LATERAL (SELECT CASE WHEN g %% 1500 = 1
                                      THEN %(now)s - %(retention)s - g
                                      ELSE %(now)s - (g::bigint * 7919) %% %(retention)s
                                      END) AS a(at)""",
        {"table": TABLE, "now": NOW, "retention": RETENTION_MS,
         "rows": RESULT_ROWS * 10 // 9})


@pytest.fixture(scope="module")
def big(template_db: str) -> Iterator[str]:
    with template_copy(template_db, prefix="delayq_results") as url:
        build(url)
        yield url


PARAMS: dict[str, Any] = {
    "table_name": TABLE, "task": '{"task": "shop.djtasks.add"}', "enqueued_at": NOW,
    "worker_id": "w2", "at": NOW, "status": "SUCCESSFUL", "finished_at": NOW,
    "return_value": "4", "errors": "[]", "prefix": "django:", "limit": 1000,
    "before": NOW - RETENTION_MS, "now": NOW, "kinds": DJANGO_KINDS,
    "lows": [None] * len(DJANGO_KINDS), "starts": [None] * len(DJANGO_KINDS),
    "floors": [None] * len(DJANGO_KINDS), "want_next": True, "lease_ms": 60_000,
    "lock": "L", "alive_ms": 10_000, "lost_class": "x.TaskInterrupted",
    "lost_template": "attempt %s (worker %s) was lost", "attempt": 1,
    "before_at": 2**63 - 1, "before_id": "", "lo": -(2**63), "since": NOW - DAY_MS,
    "cap": 1000, "ids": ["r7", "q8"],
}

#: case -> (statement, overriding parameters, the indexes its plan must use, runs on the
#: relaxed pool). ``r7`` is a result of this queue table, ``q8`` a waiting task (no result).
CASES: dict[str, tuple[str, dict[str, Any], set[str], bool]] = {
    "start_existing": ("task_results_start", {"id": "r7"}, {RESULTS_PK}, True),
    "start_new": ("task_results_start", {"id": "new-task"}, {RESULTS_PK}, True),
    "finish": ("task_results_finish", {"id": "r7"}, {RESULTS_PK}, True),
    "touch": ("task_results_touch", {"ids": [hashlib.md5(f"r{g}".encode()).hexdigest()
                                             for g in range(1, 5)]}, {RESULTS_PK}, True),
    "interrupt": ("task_results_interrupt", {"id": "r7"}, {RESULTS_PK}, False),
    "get_result": ("task_results_get", {"id": "r7"}, {RESULTS_PK, BY_KEY}, False),
    "get_waiting": ("task_results_get", {"id": "q8"}, {RESULTS_PK, BY_KEY}, False),
    "get_unknown": ("task_results_get", {"id": "nope"}, {RESULTS_PK, BY_KEY}, False),
    "prune_steady": ("task_results_prune", {}, {BY_FINISHED}, True),
    "prune_backlog": ("task_results_prune", {"before": NOW}, {BY_FINISHED}, True),
    "task_kinds": ("task_kinds", {}, {BY_KIND}, True),
    "walk_finished": ("task_results_walk", {"limit": 500}, {BY_FINISHED}, False),
    "walk_finished_old": ("task_results_walk", {"limit": 500, "before_at": NOW - 3 * DAY_MS},
                          {BY_FINISHED}, False),
    "walk_failed": ("task_results_walk_failed", {"limit": 500}, {FAILED}, False),
    "failed_since": ("task_results_failed_since", {}, {FAILED}, False),
    "by_ids": ("task_results_by_ids", {}, {RESULTS_PK, BY_KEY}, False),
    "discard": ("task_results_discard", {"id": "r7"}, {RESULTS_PK, BY_KEY}, False),
    "reopen": ("task_results_reopen", {"id": "r7"}, {RESULTS_PK}, False),
    "poll_django_kinds": ("try_poll_many", {}, {BY_KIND}, True),
}


def md5_ids(params: dict[str, Any]) -> dict[str, Any]:
    """``r7`` / ``q8`` as the keys the build gave those rows (md5 of 'r7' and 'q8')."""
    out = dict(params)
    if out.get("id") in ("r7", "q8"):
        out["id"] = hashlib.md5(out["id"].encode()).hexdigest()
    out["ids"] = [hashlib.md5(i.encode()).hexdigest() for i in out["ids"]]
    return out


def explain(conn: psycopg.Connection[Any], query: str, mode: str,
            params: dict[str, Any]) -> dict[str, Any]:
    return explain_prepared(conn, query, mode, params)


def scans(plan: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """(node type, relation, index) of every node that reads one of the two big tables or
    their indexes, conflict arbiters included."""
    out = []
    for node in plan_nodes(plan["Plan"]):
        index = node.get("Index Name")
        relation = node.get("Relation Name")
        if relation in (TABLE, RESULTS) or (index or "").startswith((TABLE, RESULTS)):
            out.append((node["Node Type"], relation, index))
        out += [("Arbiter", relation, name) for name in node.get("Conflict Arbiter Indexes", [])]
    return out


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_backends_statements_stay_on_their_index(big: str, case: str, mode: str) -> None:
    statement, overrides, wanted, relaxed = CASES[case]
    params = md5_ids({**PARAMS, **overrides})
    with Database(big, max_size=1) as db:
        pool = db.relaxed_pool if relaxed else db.pool
        with pool.connection() as conn:
            plan = explain(conn, Queries(TABLE)[statement], mode, params)
    used = scans(plan)
    shown = json.dumps(plan, indent=1)
    assert not [s for s in used if s[0] in ("Seq Scan", "Bitmap Heap Scan")], shown
    assert wanted <= {index for _, _, index in used}, (used, shown)
    # Bounded reads: no node of the big tables returned more than a prune's batch.
    assert max((n.get("Actual Rows", 0) for n in plan_nodes(plan["Plan"])
                if n.get("Relation Name") in (TABLE, RESULTS)), default=0) <= 1000, shown


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("case", ["prune_steady", "prune_backlog"])
def test_the_prune_stays_on_its_index_in_any_session(big: str, case: str, mode: str) -> None:
    """The prune, planned in a plain session (sequential scans allowed, as on a pool whose
    settings a pooler dropped): still the (tableName, finishedAt) index."""
    statement, overrides, wanted, _ = CASES[case]
    with psycopg.connect(big, autocommit=True) as conn:
        plan = explain(conn, Queries(TABLE)[statement], mode, {**PARAMS, **overrides})
    used = scans(plan)
    assert not [s for s in used if s[0] in ("Seq Scan", "Bitmap Heap Scan")], \
        json.dumps(plan, indent=1)
    assert wanted <= {index for _, _, index in used}, used


def test_the_rows_the_plans_ran_on_are_there(big: str) -> None:
    """Control: the statements above found what they were planned for (a result by id, a
    waiting task by key, a batch of expired results, the kinds), so a plan that stayed on its
    index did so while doing the work."""
    with Database(big, max_size=1) as db, db.pool.connection() as conn:
        counts = conn.execute(
            f"""SELECT (SELECT count(*) FROM {RESULTS}),
                       (SELECT count(*) FROM {RESULTS} WHERE "tableName" = %(t)s
                        AND "finishedAt" < %(before)s)""",
            {"t": TABLE, "before": NOW - RETENTION_MS}).fetchone()
        assert counts is not None and counts[0] >= RESULT_ROWS and 500 < counts[1] < 5000
        q = Queries(TABLE)
        for key, found in (("r7", (True, False)), ("q8", (False, True)), ("nope", (False, False))):
            row = conn.execute(q["task_results_get"], md5_ids({**PARAMS, "id": key})).fetchone()
            assert row is not None and (row[1] is not None, row[9] is not None) == found, key
        kinds = {r[0] for r in conn.execute(q["task_kinds"], PARAMS)}
        assert kinds == set(DJANGO_KINDS)

        walked = conn.execute(q["task_results_walk_failed"], {**PARAMS, "limit": 500}).fetchall()
        assert len(walked) == 500 and {r[2] for r in walked} == {"FAILED"}
        finished = [r[1] for r in conn.execute(q["task_results_walk"],
                                               {**PARAMS, "limit": 500}).fetchall()]
        assert len(finished) == 500 and finished == sorted(finished, reverse=True)
        assert 0 < conn.execute(q["task_results_failed_since"], PARAMS).fetchone()[0] < 1000  # type: ignore[index]


#: The statements a worker runs per task on the relaxed pool (generic plans, made once per
#: connection), each finding a result by (tableName, id).
PER_TASK = ["start_existing", "finish"]


def rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's nodes on the results table took from it: those it returned and those
    it read and dropped by a filter."""
    return sum(n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)
               for n in plan_nodes(plan["Plan"]) if n.get("Relation Name") == RESULTS)


def test_plans_made_on_an_empty_table_stay_on_the_key_as_it_grows(template_db: str) -> None:
    """A worker's relaxed connection makes each statement's generic plan at its first run and
    keeps it until the table is next analyzed: on a new deployment, while the results table is
    empty (analyzed empty: its statistics say no rows, so every index that leads with tableName
    looked as cheap as the primary key). Planned then, the per-task statements still find
    their result by the primary key, reading one row, after the table grew to 1.1M results
    (no ANALYZE between: autovacuum off)."""
    with template_copy(template_db, prefix="delayq_grown") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {RESULTS} SET UNLOGGED")
            conn.execute(f"ALTER TABLE {RESULTS} SET (autovacuum_enabled = false)")
            conn.execute(f"ANALYZE {RESULTS}")
        with Database(url, max_size=1) as db, db.relaxed_pool.connection() as conn, \
                ExitStack() as stack:
            params = {case: md5_ids({**PARAMS, **CASES[case][1]}) for case in PER_TASK}
            runs = {case: stack.enter_context(prepared(conn, Queries(TABLE)[CASES[case][0]]))
                    for case in PER_TASK}
            empty = {case: run(params[case]) for case, run in runs.items()}
            with psycopg.connect(url, autocommit=True) as grower:
                insert_results(grower)
            grown = {case: run(params[case]) for case, run in runs.items()}
    read = {case: (rows_read(plan), {index for _, _, index in scans(plan)})
            for case, plan in grown.items()}
    assert all(n <= 1 and RESULTS_PK in used for n, used in read.values()), read
    # Control: each plan is the one made on the empty table (no new generic plan since).
    assert all(scans(grown[case]) == scans(empty[case]) for case in PER_TASK)
