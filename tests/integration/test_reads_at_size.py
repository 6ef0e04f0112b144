"""Every read of the queue table behind ``delayq web``, ``delayq tasks``, ``delayq status`` and
the metrics, planned and run at size exactly as delayq runs it (issue 38, item 10).

One table of 2M rows built with generate_series: two queues with nothing due (every row due
2-26 h from now, as 5M rows "due over the next day" were when the overview's due count
scanned them all) and two with a backlog (three quarters due over the last day, the rest over
30 days), 50 in flight, 1,000 Dramatiq dead letters and a daily beat entry. Analyzed, not
vacuumed: what a busy table looks like to the planner between autovacuums (index-only scans
then cost heap fetches, and a sequential scan looked cheaper for a count that stops at a cap).

The plans come from the server itself (``auto_explain`` loaded in the one connection of the
pool the code under test uses, reporting each statement's plan with ANALYZE and BUFFERS as a
NOTICE): the statements, settings, transactions and custom or generic plans are delayq's own.
Each read must stay on an index (no sequential or bitmap scan of the queue table) and read a
bounded number of rows, whether its range holds nothing or more than its cap.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from conftest import template_copy
from starlette.testclient import TestClient

from delayq_beat.store import BeatStore, InstalledEntry
from delayq_transport import Database, DelayedQueue
from delayq_transport.browse import TaskFilter, TaskService, bulk
from delayq_transport.browse.deadletters import DeadLetterService
from delayq_transport.core.db.queries import NOT_PER_TABLE, Queries, raw_queries
from delayq_transport.core.inspect import MAX_MS, Inspector
from delayq_transport.core.integrations import CronService
from delayq_transport.core.queue import dead_letters, leases
from delayq_transport.core.queue.timeutil import from_ms
from delayq_transport.metrics.collector import DelayqCollector
from delayq_transport.web.app import create_app
from delayq_transport.web.security import WebConfig

pytestmark = pytest.mark.slow

TABLE = "delayed_queue"
ROWS = 2_000_000
IDLE = ["celery", "mail"]  # nothing due
BACKLOG = ["celery\x06\x163", "reports"]  # three quarters due
KINDS = IDLE + BACKLOG  # row g is of kind KINDS[g % 4]
DEAD = "dramatiq:default.XQ"
BEAT = "celery.backend_cleanup"
BEAT_HASH = "0123456789abcdef"
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
#: Rows any one read may go through (index entries and heap rows, over every scan of the queue
#: table in its plan): a twentieth of the table. Caps bound them (the overview reads up to
#: 11,000 per kind, the status 20,000); a read that walks a range holding nothing, or a whole
#: kind, reads far more.
MOST_ROWS = 100_000
#: ``delayq status`` and the metrics count up to this many rows per kind and measure (the
#: default, 100,000, would be a fifth of this table for each of its 5 kinds).
STATUS_CAP = 10_000
#: A valid Celery message cut to the fields the list decodes (~200 bytes).
SMALL_PAYLOAD = json.dumps({
    "body": base64.b64encode(b'[[{"user": 1}], {}, {}]').decode(), "content-type":
    "application/json", "headers": {"task": "app.remind", "id": "x"},
    "properties": {"body_encoding": "base64", "priority": 0}}).encode()
DEAD_PAYLOAD = json.dumps({
    "queue_name": "default", "actor_name": "app.charge", "args": [1], "kwargs": {},
    "message_id": "0b7e6a5c-0000-4000-8000-000000000000", "message_timestamp": 1700000000000,
    "options": {"retries": 20, "traceback": "ValueError: card declined"}}).encode()
#: The key of row 7 (keys are md5 of the row's number).
KEY_7 = hashlib.md5(b"7").hexdigest()
INDEXES = """SELECT indexdef FROM pg_indexes
             WHERE tablename = 'delayed_queue' AND indexname LIKE '%%Index'"""


def build(url: str) -> int:
    """The table above; returns the database's now (ms) it was built around. Fast on a busy
    machine: unlogged, indexes dropped during the insert and rebuilt after (same
    definitions), triggers off."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()
        assert row is not None
        now = int(row[0])
        indexes = [r[0] for r in conn.execute(INDEXES)]
        conn.execute("ALTER TABLE delayed_queue SET UNLOGGED")
        conn.execute("ALTER TABLE delayed_queue SET (autovacuum_enabled = false)")
        conn.execute("ALTER TABLE delayed_queue DISABLE TRIGGER USER")
        for index in indexes:
            conn.execute("DROP INDEX " + index.split(" INDEX ")[1].split(" ON ")[0])
        conn.execute(
            """INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",
                                          "scheduledAtInitially", "createdAt")
               SELECT md5(g::text), (%(kinds)s::text[])[1 + g %% 4], %(payload)s, at, at,
                      %(now)s
               FROM generate_series(1, %(rows)s) AS g, LATERAL (
                   SELECT CASE WHEN g %% 4 < 2 OR g %% 16 < 4
                               THEN %(now)s + 2 * %(hour)s + (g::bigint * 7919) %% %(day)s
                               ELSE %(now)s - 1000 - (g::bigint * 7919) %% %(day)s END) AS a(at)
            """, {"kinds": KINDS, "payload": SMALL_PAYLOAD, "now": now, "rows": ROWS,
                  "hour": HOUR_MS, "day": DAY_MS})
        conn.execute("SET maintenance_work_mem = '256MB'")
        for index in indexes:
            conn.execute(index)
        conn.execute("""UPDATE delayed_queue SET "lockUuid" = 'lock-' || id,
                        "scheduledAt" = %(now)s + %(day)s WHERE id <= 50""",
                     {"now": now, "day": DAY_MS})
        conn.execute("""UPDATE delayed_queue SET "pKind" = %(dead)s, "payload" = %(p)s,
                        "scheduledAt" = %(now)s + 7 * %(day)s - id %% %(day)s
                        WHERE id %% 2000 = 17""",
                     {"dead": DEAD, "p": DEAD_PAYLOAD, "now": now, "day": DAY_MS})
        for day in range(3):  # a daily beat entry, in a queue of a million nothing-due rows
            at = now + 3 * HOUR_MS + day * DAY_MS
            conn.execute("""INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",
                                                       "scheduledAtInitially", "createdAt")
                            VALUES (%s, 'celery', %s, %s, %s, %s)""",
                         (f"{BEAT}/{BEAT_HASH}/{at}", SMALL_PAYLOAD, at, at, now))
        conn.execute("ALTER TABLE delayed_queue ENABLE TRIGGER USER")
        conn.execute("ANALYZE delayed_queue")
    with Database(url) as db:
        BeatStore(db, TABLE).record_installed(
            [InstalledEntry(BEAT, "celery", BEAT_HASH, now + 5 * DAY_MS, 0)])
    return now


@pytest.fixture(scope="module")
def big(template_db: str) -> Iterator[tuple[str, int]]:
    with template_copy(template_db, prefix="delayq_reads") as url:
        yield url, build(url)


# -- plans as the server ran them ------------------------------------------------------------

PLACEHOLDER = re.compile(r"%\(\w+\)[sbt]|\$\d+")


def normalized(sql: str) -> str:
    """Statement text as sent and as the server reports it alike: placeholders (delayq's
    ``%(name)s``, psycopg's ``$n``) as ``?``, ``%%`` as ``%``, whitespace collapsed."""
    return " ".join(PLACEHOLDER.sub("?", sql).replace("%%", "%").split())


@dataclass
class Watch:
    """Plans of every statement one Database's (single) connection ran, by statement name."""

    names: dict[str, str]
    plans: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" not in text:
            return
        plan = json.loads(text.split("plan:", 1)[1])
        name = self.names.get(normalized(plan["Query Text"]), plan["Query Text"][:60])
        self.plans.append((name, plan))

    def statements(self) -> set[str]:
        return {name for name, _ in self.plans}

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        taken, self.plans = self.plans, []
        return taken


@pytest.fixture(params=["custom", "generic"])
def watched(request: pytest.FixtureRequest, big: tuple[str, int]
            ) -> Iterator[tuple[DelayedQueue, Watch]]:
    """A queue on the big table whose one pooled connection reports every plan it runs.
    ``generic``: each statement prepared from its second run and planned for any parameters,
    as psycopg and the server settle on after a few executions of the same statement."""
    url, _ = big
    q = Queries(TABLE)
    watch = Watch({normalized(q[name]): name for name in raw_queries()
                   if not name.startswith(NOT_PER_TABLE)})
    with Database(url, min_size=1, max_size=1) as db:
        with db.pool.connection() as conn:
            conn.execute("LOAD 'auto_explain'")
            for setting, value in (("log_min_duration", "0"), ("log_analyze", "on"),
                                   ("log_buffers", "on"), ("log_format", "json"),
                                   ("log_level", "notice")):
                conn.execute(f"SET auto_explain.{setting} = '{value}'")
            if request.param == "generic":
                conn.execute("SET plan_cache_mode = force_generic_plan")
                conn.prepare_threshold = 1  # prepared from the second run (0 would prepare
                # the plan guard too, which psycopg never does with statements without values)
            conn.add_notice_handler(watch.on_notice)
        with DelayedQueue(db, ensure_schema=False) as queue:
            yield queue, watch


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


#: The queue table's own indexes (its key and the design's three); the control tables' names
#: start with the table's too, and are not it.
TABLE_INDEXES = {f"{TABLE}_pkey", f"{TABLE}__PKeyPlusKindUniqueIndex",
                 f"{TABLE}__KindPlusScheduledAtIndex", f"{TABLE}__LockUuidPlusIdIndex"}


def on_table(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for n in nodes(plan["Plan"])
            if n.get("Relation Name") == TABLE or n.get("Index Name") in TABLE_INDEXES]


def rows_read(node: dict[str, Any]) -> int:
    """Index entries or heap rows a scan node went through, over all its loops."""
    loops = int(node.get("Actual Loops", 1))
    seen = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0) \
        + node.get("Rows Removed by Index Recheck", 0)
    return int(seen * loops)


def assert_bounded(plans: list[tuple[str, dict[str, Any]]], what: str) -> None:
    """Every plan that touched the queue table stayed on an index and read few rows."""
    assert plans, f"{what}: no statement reported its plan"
    for name, plan in plans:
        scans = on_table(plan)
        kinds = {n["Node Type"] for n in scans}
        shown = json.dumps(plan["Plan"], indent=1)[:4000]
        assert not kinds & {"Seq Scan", "Bitmap Heap Scan", "Bitmap Index Scan"}, \
            f"{what}: {name} scans the table:\n{shown}"
        read = sum(rows_read(n) for n in scans)
        assert read <= MOST_ROWS, f"{what}: {name} read {read} rows:\n{shown}"


# -- the reads -------------------------------------------------------------------------------

def web_calls(now: int) -> list[str]:
    """Every page and API call of ``delayq web`` that reads."""
    hour_ahead = now + 3 * HOUR_MS
    return [
        "/", "/?hours=168", "/api/overview", "/api/timeline?hours=168&buckets=56", "/tasks",
        "/tasks?queue=mail", "/tasks?queue=reports", "/tasks?state=due",
        "/tasks?state=in_flight", "/tasks?state=redelivered", "/tasks?task=app.other*",
        f"/tasks?eta_after={hour_ahead}&eta_before={hour_ahead + DAY_MS}",
        "/tasks?text=nobody-has-this", "/api/tasks?limit=500", "/tasks/1", "/api/tasks/1",
        f"/api/tasks/{KEY_7}", "/watch?ids=k1,k2," + KEY_7,
        "/beat", "/api/beat", "/dead-letters", "/api/dead-letters?queue=default",
        "/workers", "/api/workers", "/api/tasks/bulk/preview?all=1&queue=mail",
        f"/api/tasks/bulk/preview?all=1&eta_after={hour_ahead}"
        f"&eta_before={hour_ahead + HOUR_MS}",
    ]


def iso_ms(ms: int) -> str:
    from delayq_transport.core.queue import from_ms

    return from_ms(ms).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_every_web_page_and_api_call_reads_on_an_index(
        watched: tuple[DelayedQueue, Watch], big: tuple[str, int]) -> None:
    queue, watch = watched
    now = big[1]
    client = TestClient(create_app(queue, WebConfig()), base_url="http://127.0.0.1:8377")
    dead_id = dead_letters.dead_letters_page(queue, [DEAD], (MAX_MS, MAX_MS), 1)[0][0]
    calls = [re.sub(r"eta_(after|before)=(\d+)", lambda m: f"eta_{m[1]}={iso_ms(int(m[2]))}",
                    c) for c in web_calls(now)] + [f"/dead-letters/{dead_id}"]
    watch.take()
    for path in calls:
        for _ in range(2):  # a generic plan is made at the first run; the second uses it
            response = client.get(path)
            assert response.status_code == 200, (path, response.text[:300])
        assert_bounded(watch.take(), path)


def per_kind_reads(queue: DelayedQueue, kinds: list[str], now: int
                   ) -> dict[str, Callable[[], Any]]:
    """The reads of ``delayq tasks`` and kombu's queue size for some kinds."""
    inspector = Inspector(queue)
    edges = [now - DAY_MS + i * HOUR_MS for i in range(49)]
    return {
        "overview": lambda: inspector.overview(kinds, 5000, 1000),
        "due count": lambda: queue.count_due(kinds),
        "timeline": lambda: inspector.timeline(kinds, edges, 500),
        "window": lambda: inspector.window(kinds, budget=500),
        "window from now": lambda: inspector.window(kinds, lo=now, budget=50),
        "held": lambda: inspector.held(kinds),
    }


@pytest.mark.parametrize("kinds", [IDLE, BACKLOG], ids=["nothing-due", "backlog"])
def test_tasks_reads_and_counts_read_on_an_index(watched: tuple[DelayedQueue, Watch],
                                                 big: tuple[str, int], kinds: list[str]) -> None:
    queue, watch = watched
    for what, read in per_kind_reads(queue, kinds, big[1]).items():
        watch.take()
        for _ in range(2):
            read()
        assert_bounded(watch.take(), what)


def test_status_metrics_workers_dead_letters_and_beat_read_on_an_index(
        watched: tuple[DelayedQueue, Watch]) -> None:
    queue, watch = watched
    reads: dict[str, Callable[[], Any]] = {
        "status": lambda: queue.status(cap=STATUS_CAP),
        "metrics": lambda: list(DelayqCollector(queue, cap=STATUS_CAP).collect()),
        "workers": lambda: leases.workers(queue),
        "dead letters": lambda: DeadLetterService(queue).list_page("default"),
        "dead-letter counts": lambda: DeadLetterService(queue).queues(),
        "beat": lambda: CronService(queue.with_kind("celery")).installed(
            BEAT, 3, config_hash=BEAT_HASH),
        "kinds": lambda: Inspector(queue).kinds(),
    }
    for what, read in reads.items():
        watch.take()
        for _ in range(2):
            read()
        assert_bounded(watch.take(), what)


def test_every_read_statement_was_watched(watched: tuple[DelayedQueue, Watch],
                                         big: tuple[str, int]) -> None:
    """The tests above saw every statement they are about (a read that moved to another
    connection, or a statement renamed, would otherwise go unchecked)."""
    queue, watch = watched
    client = TestClient(create_app(queue, WebConfig()), base_url="http://127.0.0.1:8377")
    for path in web_calls(big[1]):
        client.get(re.sub(r"eta_(after|before)=(\d+)",
                          lambda m: f"eta_{m[1]}={iso_ms(int(m[2]))}", path))
    list(DelayqCollector(queue, cap=STATUS_CAP).collect())  # status and health
    queue.count_due(IDLE)
    assert watch.statements() >= {
        "inspect_kinds", "inspect_overview", "inspect_timeline", "inspect_window",
        "inspect_held", "inspect_by_ids", "inspect_by_key", "inspect_by_keys", "inspect_stats",
        "status_estimates", "leases_held", "bindings_seen", "dead_letters_page",
        "dead_letters_count", "cron_list_config", "count_due", "status_capped",
        "status_in_flight", "health_table", "health_indexes", "health_blockers",
    }, sorted(watch.statements())


@pytest.mark.parametrize("action", ["cancel", "reschedule"])
def test_a_bulk_action_writes_through_the_primary_key(watched: tuple[DelayedQueue, Watch],
                                                       big: tuple[str, int], action: str,
                                                       request: pytest.FixtureRequest) -> None:
    """What a bulk action on the page runs (in the background above its threshold): the
    matches collected in keyset windows, then batches of writes by primary key, each checked
    against the row as it matched. A minute of the ``mail`` queue (~350 rows), a different
    one for each test, so the rows this test changes are not those of another."""
    queue, watch = watched
    svc = TaskService(queue)
    start = big[1] + 3 * HOUR_MS + zlib.crc32(request.node.name.encode()) % (20 * HOUR_MS)
    f = TaskFilter.parse(queue="mail", eta_after=iso_ms(start), eta_before=iso_ms(start + 60_000))
    watch.take()
    targets = bulk.target_ids(svc, f)
    result = bulk.apply(svc, action, targets, shift_ms=60_000 if action == "reschedule" else None)
    assert len(targets) > 100 and result.done == len(targets), result
    plans = watch.take()
    write = "inspect_cancel_unchanged" if action == "cancel" else "inspect_reschedule_many"
    assert {"inspect_match_window", write} <= {name for name, _ in plans}
    assert_bounded(plans, f"bulk {action}")


def test_a_configuration_switch_deletes_through_the_key_index(
        watched: tuple[DelayedQueue, Watch], big: tuple[str, int]) -> None:
    """installTick of the daily beat entry's configuration (CronService.install_tick) deletes
    its other configurations' occurrences (three planted before each run) through the key range
    of the (pKey, pKind) index: it reads the prefix's few keys, not the million rows of its
    kind, as the LIKE with a bound pattern did (in this database's C.UTF-8 collation, in custom
    plans too). The entry's own occurrences stay."""
    queue, watch = watched
    celery = queue.with_kind("celery")
    cron = CronService(celery)
    for run in range(2):  # with ``generic``, the second run is the generic plan's
        at = big[1] + (10 + run) * DAY_MS
        for i in range(3):
            celery.offer(f"{BEAT}/old{run}/{at + i}", b"x", from_ms(at + i))
        watch.take()
        cron.install_tick(BEAT_HASH, BEAT, [])
        plans = [(name, plan) for name, plan in watch.take()
                 if name.startswith("cron_delete_other_configs")]
    assert [name for name, _ in plans] == ["cron_delete_other_configs"]
    scans = [n for n in on_table(plans[0][1]) if n["Node Type"] != "ModifyTable"]
    shown = json.dumps(plans[0][1]["Plan"], indent=1)
    assert {n.get("Index Name") for n in scans} - {None} == \
        {f"{TABLE}__PKeyPlusKindUniqueIndex"}, shown
    # The prefix's keys: the heap rows of this run, and (a generic plan's bitmap) index
    # entries of the rows this module's runs deleted.
    assert sum(rows_read(n) for n in scans) <= 100 and scans[0]["Actual Rows"] == 3, shown
    assert len(cron.installed(BEAT, config_hash=BEAT_HASH)) == 3


def test_without_the_plan_guard_the_overview_scans_the_table(big: tuple[str, int]) -> None:
    """Control: on a plain connection, without the settings every inspection read runs with
    (count_plan_guard), the overview of the queues with nothing due plans a sequential scan
    (the guard is what the tests above rely on, not a lucky estimate)."""
    params = {"kinds": IDLE, "cap": 5000, "redelivered_cap": 1000, "now": None}
    with psycopg.connect(big[0], autocommit=True) as conn:
        conn.execute("SET jit = off")
        row = conn.execute("EXPLAIN (FORMAT JSON) " + Queries(TABLE)["inspect_overview"],
                           params).fetchone()
    assert row is not None
    assert "Seq Scan" in {n["Node Type"] for n in on_table(row[0][0])}


def test_list_filters_and_timeline_answer_from_the_big_table(big: tuple[str, int]) -> None:
    """What the pages show at size: the 50 rows in flight, capped counts, estimated buckets."""
    url, now = big
    with DelayedQueue(url, ensure_schema=False) as q:
        svc = TaskService(q)
        assert len(svc.list_page(TaskFilter.parse(state="in_flight")).items) == 50
        page = svc.list_page(TaskFilter.parse(queue="mail"), limit=50)
        assert len(page.items) == 50 and all(v.row.scheduled_at_ms > now for v in page.items)
        overview = Inspector(q).overview(KINDS, 5000, 1000)
        due = {k.kind: k.due for k in overview}
        assert due["celery"] == due["mail"] == 0  # nothing due, counted from an empty range
        assert due["reports"] == due["celery\x06\x163"] == 5000  # the cap
        t = svc.timeline(24 * 7, 56)
        assert any(t.estimated) and sum(t.counts) > ROWS // 10  # estimated, not counted
        assert [r.key for r in CronService(q.with_kind("celery")).installed(
            BEAT, 3, config_hash=BEAT_HASH)] == [
                f"{BEAT}/{BEAT_HASH}/{now + 3 * HOUR_MS + d * DAY_MS}" for d in range(3)]

