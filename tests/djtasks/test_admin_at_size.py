"""delayq's admin pages at production size (issue 50): 5M waiting rows (django.tasks and Celery
kinds, a few in flight, dead letters) and 1M task results (one in a thousand failed), built
with generate_series and analyzed, then every page and action of the admin rendered by
Django's test client against the real project while every statement it sends is captured at
the driver. Each statement on a delayq table is then planned as sent (prepared, generic and
custom plans) under EXPLAIN ANALYZE, rolled back, and must stay on an index and read a bounded
number of rows: no sequential or bitmap scan, no count or sort of a table.

Django's changelist counts the table and sorts it by default; these pages never do (keyset
pages from the services' bounded reads), and this is the check that they do not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.test import Client
from integration._prepared import explain_prepared

from delayq_transport.core.db.queries import Queries
from delayq_transport.formats.celery import encode, task_message

#: Building 6M rows takes minutes on a busy 2-core machine (the default timeout is 300 s).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ADMIN = "/admin/delayq_admin"
TABLE, RESULTS = "delayed_queue", "delayq_task_results"
BIG = (TABLE, RESULTS)
#: Waiting rows per kind (5M in all).
KINDS = {"django:default:0": 2_500_000, "django:mail:0": 500_000,
         "django:default:10": 200_000, "celery": 1_500_000, "celery\x06\x163": 300_000}
RESULT_ROWS = 1_000_000
DEAD_LETTERS = 2_000
DAY_MS = 86_400_000
#: Most rows any node of a plan may return from a big table: a page's window (5,000 rows of
#: a bounded scan), a walk of the results (2,000), a capped count (10,000).
MAX_ROWS = 10_000


def django_payload(queue: str, priority: int) -> str:
    return json.dumps({"task": f"shop.djtasks.{'mail_add' if queue == 'mail' else 'add'}",
                       "args": ["ARG", 1], "kwargs": {}, "backend": "default", "queue": queue,
                       "priority": priority, "run_after_us": None, "enqueued_at": 1})


def celery_payload() -> str:
    msg = task_message("billing.remind", [{"account": "ARG"}], {}, task_id="TASKID")
    return encode(msg).decode()


def dramatiq_payload() -> str:
    return json.dumps({"queue_name": "default", "actor_name": "payments.charge",
                       "args": ["ARG"], "kwargs": {}, "message_id": "TASKID",
                       "message_timestamp": 1, "options": {
                           "retries": 3, "delayq_exception": "KeyError: 'ARG'",
                           "delayq_traceback": "Traceback\nKeyError: 'ARG'"}})


def build(url: str) -> None:
    """The two tables, fast: unlogged, indexes dropped during the inserts and made again (the
    same definitions), triggers off (no wake-ups), then analyzed as autovacuum would have."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        now = int(conn.execute("SELECT floor(extract(epoch FROM now()) * 1000)").fetchone()[0])  # type: ignore[index]
        for table in BIG:  # unlogged while the test runs: no WAL for 6M rows
            conn.execute(f"TRUNCATE {table}")
            conn.execute(f"ALTER TABLE {table} SET UNLOGGED")
        indexes = {t: [r[0] for r in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef NOT LIKE "
            "'%%UNIQUE INDEX %%pkey%%'", [t])] for t in BIG}
        for t in BIG:
            for index in indexes[t]:
                conn.execute("DROP INDEX " + index.split(" INDEX ")[1].split(" ON ")[0])
        conn.execute(f"ALTER TABLE {TABLE} DISABLE TRIGGER USER")
        start = 0
        for kind, rows in KINDS.items():
            payload = celery_payload() if kind.startswith("celery") else \
                django_payload(kind.split(":")[1], int(kind.split(":")[2]))
            # Due over the last hour for one in 20, else over the next 7 days.
            conn.execute(
                f"""INSERT INTO {TABLE} ("pKey", "pKind", payload, "scheduledAt",
                                         "scheduledAtInitially", "createdAt")
                    SELECT md5(%(kind)s || g), %(kind)s,
                           convert_to(replace(replace(%(payload)s, 'TASKID', md5(g::text)),
                                              'ARG', g::text), 'UTF8'), a.at, a.at, %(now)s
                    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g,
                         LATERAL (SELECT CASE WHEN g %% 20 = 0
                                              THEN %(now)s - (g * 7919) %% 3600000
                                              ELSE %(now)s + (g * 7919) %% (7 * %(day)s)
                                              END) AS a(at)""",
                {"kind": kind, "payload": payload, "now": now, "day": DAY_MS,
                 "lo": start + 1, "hi": start + rows})
            start += rows
        conn.execute(
            f"""INSERT INTO {TABLE} ("pKey", "pKind", payload, "scheduledAt",
                                     "scheduledAtInitially", "createdAt")
                SELECT md5('x' || g), 'dramatiq:default.XQ',
                       convert_to(replace(replace(%(payload)s, 'TASKID', md5(g::text)),
                                          'ARG', g::text), 'UTF8'),
                       %(now)s + 7 * %(day)s - g * 1000, %(now)s - g * 1000, %(now)s
                FROM generate_series(1, %(rows)s) AS g""",
            {"payload": dramatiq_payload(), "now": now, "day": DAY_MS, "rows": DEAD_LETTERS})
        conn.execute(
            f"""INSERT INTO {RESULTS} ("tableName", "id", "task", "status", "enqueuedAt",
                                       "startedAt", "lastAttemptedAt", "finishedAt",
                                       "returnValue", "errors", "workerIds", "updatedAt")
                SELECT %(table)s, md5('r' || g),
                       jsonb_build_object('task', CASE WHEN g %% 3 = 0
                                                       THEN 'shop.djtasks.mail_add'
                                                       ELSE 'shop.djtasks.add' END,
                                          'queue', CASE WHEN g %% 3 = 0 THEN 'mail'
                                                        ELSE 'default' END,
                                          'priority', 0, 'args', jsonb_build_array(g, 1),
                                          'kwargs', '{{}}'::jsonb, 'backend', 'default'),
                       s.status, at - 5, at - 2, at - 2, at, '3',
                       CASE WHEN s.status = 'FAILED'
                            THEN jsonb_build_array(jsonb_build_object(
                                'exception_class_path', 'builtins.ValueError',
                                'traceback', 'Traceback\nValueError: boom ' || g))
                            ELSE '[]'::jsonb END, '["w1"]', at
                FROM generate_series(1, %(rows)s::bigint) AS g,
                     LATERAL (SELECT CASE WHEN g %% 1000 = 7 THEN 'FAILED'
                                          ELSE 'SUCCESSFUL' END) AS s(status),
                     LATERAL (SELECT %(now)s - (g * 7919) %% (7 * %(day)s)) AS a(at)""",
            {"table": TABLE, "now": now, "day": DAY_MS, "rows": RESULT_ROWS})
        for t in BIG:
            for index in indexes[t]:
                conn.execute(index)
        conn.execute(f"""UPDATE {TABLE} SET "lockUuid" = 'lock-' || id,
                         "scheduledAt" = %(now)s + 60000 WHERE id %% 100000 = 3""",
                     {"now": now})
        conn.execute(f"ALTER TABLE {TABLE} ENABLE TRIGGER USER")
        for t in BIG:
            conn.execute(f"ANALYZE {t}")


@pytest.fixture(scope="module")
def big(dj_url: str) -> Iterator[str]:
    build(dj_url)
    yield dj_url
    with psycopg.connect(dj_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}, {RESULTS}")
        for table in BIG:  # as the other tests have them (empty: no rewrite to speak of)
            conn.execute(f"ALTER TABLE {table} SET LOGGED")


@pytest.fixture(autouse=True)
def _fresh(request: pytest.FixtureRequest) -> Iterator[None]:
    """This module's tests share the big tables (the directory's ``_fresh`` would empty
    them); the process' pools are closed after each test all the same."""
    yield
    from django.db import connections

    from delayq_transport.django.backend import close_stores
    from delayq_transport.django.target import close_queues

    close_stores()
    close_queues()
    connections.close_all()


Sent = list[tuple[str, dict[str, Any], bool]]


@contextmanager
def captured() -> Iterator[Sent]:
    """Every statement with named parameters sent through psycopg meanwhile (delayq's
    statements all are; Django's own use ``%s``), and whether delayq's plan guard
    (``count_plan_guard``: the bounded reads' settings) preceded it in its transaction."""
    sent: Sent = []
    guarded: set[int] = set()
    original = psycopg.Cursor.execute

    def spy(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        conn = id(self.connection)
        if isinstance(query, str) and query.startswith("SET LOCAL enable_seqscan"):
            guarded.add(conn)
        elif isinstance(query, str) and isinstance(params, dict):
            sent.append((query, dict(params), conn in guarded))
            guarded.discard(conn)
        return original(self, query, params, **kw)

    psycopg.Cursor.execute = spy  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def root() -> Client:
    found = User.objects.filter(username="root").first() or \
        User.objects.create_superuser("root", password="x")
    client = Client()
    client.force_login(found)
    return client


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def on_big(node: dict[str, Any]) -> bool:
    return node.get("Relation Name") in BIG or \
        str(node.get("Index Name") or "").startswith(BIG)


def check_plans(url: str, sent: Sent) -> list[str]:
    """Each statement on a big table, planned as sent (under the plan guard when it ran under
    it) in both plan modes: what it read. Asserts no table scan, no sort of a table and a
    bounded read."""
    seen = []
    guard = Queries(TABLE)["count_plan_guard"]
    with psycopg.connect(url, autocommit=True) as conn:
        for query, params, guarded in sent:
            if not re.search(r'"?(delayed_queue|delayq_task_results)"?\b', query):
                continue
            query = query.replace(")b", ")s")
            took = []
            for mode in ("force_generic_plan", "force_custom_plan"):
                with conn.transaction(force_rollback=True):
                    if guarded:
                        conn.execute(guard)
                    explained = explain_prepared(conn, query, mode, params)
                plan = explained["Plan"]
                took.append(float(explained["Execution Time"]))
                big = [n for n in nodes(plan) if on_big(n)]
                shown = json.dumps(plan, indent=1)[:6000]
                assert not [n for n in big if n["Node Type"] in (
                    "Seq Scan", "Bitmap Heap Scan", "Bitmap Index Scan")], shown
                assert max((n.get("Actual Rows", 0) for n in big), default=0) <= MAX_ROWS, \
                    shown
                sorts = [n for n in nodes(plan) if n["Node Type"] == "Sort"]
                assert all(n.get("Actual Rows", 0) <= MAX_ROWS for n in sorts), shown
            used = sorted({str(n.get("Index Name")) for n in big if n.get("Index Name")})
            rows = max((n.get("Actual Rows", 0) for n in big), default=0)
            seen.append(f"{'guarded ' if guarded else ''}{' '.join(query.split())[:70]}... "
                        f"{used} max rows {rows}, {max(took):.1f} ms")
    return seen


PAGES = [
    "task/", "task/?state=due", "task/?state=retrying", "task/?state=in_flight",
    "task/?kind=django:mail:0", "task/?task=shop.djtasks.mail*", "task/?q=%2242%22",
    "result/", "result/?status=FAILED", "result/?status=SUCCESSFUL&queue=mail",
    "result/?status=FAILED&queue=mail&finished=past+24+hours", "result/?task=shop.*mail*",
    "deadletter/", "deadletter/?queue=default", "periodicentry/",
]


def test_every_page_reads_a_bounded_slice_on_its_index(big: str) -> None:
    client = root()
    with captured() as sent:
        for page in PAGES:
            response = client.get(f"{ADMIN}/{page}")
            assert response.status_code == 200, page
            assert "delayq could not read" not in response.content.decode(), page
        listed = client.get(f"{ADMIN}/task/").content.decode()
        nxt = re.search(r'href="\?([^"]*cursor=[^"]+)" id="delayq-next-page"', listed)
        assert nxt is not None
        assert client.get(f"{ADMIN}/task/?" + nxt.group(1).replace("&amp;", "&")
                          ).status_code == 200
        results = client.get(f"{ADMIN}/result/?status=FAILED").content.decode()
        failed = re.findall(r'<tr data-ident="([^"]+)"', results)
        assert len(failed) == 100  # a full page of the 1,000 failures
        rows = re.findall(r'<tr data-ident="(\d+)"', listed)
        assert len(rows) == 100
        letters = re.findall(r'<tr data-ident="(\d+)"',
                             client.get(f"{ADMIN}/deadletter/").content.decode())
        for url in (f"task/{rows[0]}/change/", f"result/{failed[0]}/change/",
                    f"deadletter/{letters[0]}/change/"):
            assert client.get(f"{ADMIN}/{url}").status_code == 200, url
        # Actions: each a named statement by key or id.
        for page, action, ident in (("task", "run_now", rows[1]), ("task", "cancel", rows[2]),
                                    ("result", "retry", failed[1]),
                                    ("result", "discard", failed[2]),
                                    ("deadletter", "retry", letters[1]),
                                    ("deadletter", "discard", letters[2])):
            done = client.post(f"{ADMIN}/{page}/act/", {"action": action, "ids": [ident]},
                               follow=True)
            assert f"{done.content.decode()}".count("done") >= 1, (page, action)
    seen = check_plans(big, sent)
    assert len(seen) >= 25, seen
    print("\n".join(seen))


def test_the_pages_send_no_count_and_no_offset(big: str) -> None:
    """What Django's changelist would send (a count of the table, OFFSET pages) is not in what
    these pages send."""
    client = root()
    with captured() as sent:
        for page in PAGES:
            client.get(f"{ADMIN}/{page}")
    on_tables = [q for q, _, _ in sent if TABLE in q or RESULTS in q]
    assert on_tables
    assert not [q for q in on_tables if re.search(r"\bOFFSET\b", q, re.I)]
    counts = [q for q in on_tables if re.search(r"count\(\*\)", q, re.I)]
    # The only counts are capped ones (a LIMIT inside): dead letters per queue.
    assert all(re.search(r"LIMIT %\(cap\)s", q) for q in counts), counts
