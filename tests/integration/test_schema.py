"""The schema: idempotent (and concurrent) migrations, migrated == declared, custom table names,
the dequeue statement's index use, and NOTIFY wake-ups."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _prepared import as_prepared
from _workers import MP, WAIT_S, run_migrate
from conftest import create_database, drop_database
from sqlalchemy import MetaData, Table, create_engine, inspect
from sqlalchemy.dialects import postgresql

from delayq_transport import Database, DelayedQueue, Offer, migrate
from delayq_transport.core.db.queries import Queries, notify_channel
from delayq_transport.core.schema.migrations import (
    MIGRATIONS,
    current_version,
    queue_table,
    runs_table,
)


@pytest.fixture
def empty_db() -> Iterator[str]:
    """A database without delayq's schema (not copied from the migrated template)."""
    name = f"delayq_e_{uuid.uuid4().hex[:12]}"
    url = create_database(name)
    yield url
    drop_database(name)


# -- migrations --------------------------------------------------------------------------------


def test_migrate_is_idempotent(empty_db: str) -> None:
    versions = [m.version for m in MIGRATIONS]
    with Database(empty_db, max_size=1) as db:
        assert current_version(db, "delayed_queue") == 0
        assert migrate(db, "delayed_queue") == versions
        assert migrate(db, "delayed_queue") == []
        assert current_version(db, "delayed_queue") == max(versions)
    with DelayedQueue(empty_db) as q:  # construction migrates again: still nothing to do
        q.offer("k", b"x")
        assert q.try_poll().ack()


@pytest.mark.slow
@pytest.mark.parametrize("tables", [["delayed_queue"] * 4, ["q_one", "q_two"] * 2])
def test_concurrent_migrate_on_a_fresh_database(empty_db: str, tables: list[str]) -> None:
    barrier, out = MP.Barrier(len(tables)), MP.Queue()
    procs = [MP.Process(target=run_migrate, args=(empty_db, t, barrier, out)) for t in tables]
    for p in procs:
        p.start()
    errors = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(WAIT_S)
    assert errors == [None] * len(tables)
    with Database(empty_db, max_size=1) as db:
        for table in set(tables):
            assert current_version(db, table) == max(m.version for m in MIGRATIONS)
            assert migrate(db, table) == []


# -- migrated schema == declared schema --------------------------------------------------------


def sqlalchemy_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def describe_declared(table: Table) -> dict[str, Any]:
    dialect = postgresql.dialect()
    return {
        "columns": [(c.name, c.type.compile(dialect), c.nullable) for c in table.columns],
        "pk": [c.name for c in table.primary_key.columns],
        "indexes": sorted(
            (i.name, [c.name for c in i.columns], bool(i.unique)) for i in table.indexes
        ),
    }


def describe_reflected(url: str, name: str) -> dict[str, Any]:
    engine = create_engine(sqlalchemy_url(url))
    try:
        insp, dialect = inspect(engine), postgresql.dialect()
        return {
            "columns": [(c["name"], c["type"].compile(dialect), c["nullable"])
                        for c in insp.get_columns(name)],
            "pk": insp.get_pk_constraint(name)["constrained_columns"],
            "indexes": sorted(
                (i["name"], i["column_names"], bool(i["unique"])) for i in insp.get_indexes(name)
            ),
        }
    finally:
        engine.dispose()


@pytest.mark.parametrize("table", ["delayed_queue", "Custom_Jobs_2"])
def test_migrated_schema_equals_declared(database_url: str, table: str) -> None:
    DelayedQueue(database_url, table=table).close()
    declared = describe_declared(queue_table(table, MetaData()))
    assert describe_reflected(database_url, table) == declared
    assert [name for name, _, _ in declared["indexes"]] == [
        f"{table}__KindPlusScheduledAtIndex",
        f"{table}__LockUuidPlusIdIndex",
        f"{table}__PKeyPlusKindUniqueIndex",
    ]
    assert declared["columns"][1:3] == [("pKey", "VARCHAR(200)", False),
                                        ("pKind", "VARCHAR(100)", False)]


@pytest.mark.parametrize("table", ["delayed_queue", "Custom_Jobs_2"])
def test_run_ledger_equals_declared_and_prunes_through_its_index(database_url: str,
                                                                 table: str) -> None:
    """Migration 11: the ledger of each queue table, and its retention DELETE reading the
    appliedAt index (not the whole ledger) however large the ledger grows."""
    DelayedQueue(database_url, table=table).close()
    declared = describe_declared(runs_table(table, MetaData()))
    assert describe_reflected(database_url, f"{table}__runs") == declared
    assert declared["pk"] == ["runId", "part"]
    q = Queries(table)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{table}__runs" SELECT \'r\' || i, 0, 1, 0, '
                     "(extract(epoch FROM now()) * 1000)::bigint FROM generate_series(1, 20000) i")
        conn.execute(f'ANALYZE "{table}__runs"')
        params = {"retention_ms": 86_400_000, "limit": 10_000, "now": None}
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + q["runs_prune"], params).fetchone()[0]
    scans = [n for n in plan_nodes(plan[0]["Plan"]) if n.get("Relation Name") == f"{table}__runs"
             and "Scan" in n["Node Type"]]
    inner = [n for n in scans if n.get("Index Name") == f"{table}__runs_by_applied_at"]
    assert inner, f"the prune's subquery does not use the appliedAt index: {plan}"


def test_custom_table_is_separate(database_url: str) -> None:
    with DelayedQueue(database_url, kind="k", table="other_jobs") as custom, \
            DelayedQueue(database_url, kind="k") as default:
        custom.offer("x", b"custom")
        default.offer("x", b"default")
        assert custom.try_poll().payload == b"custom"
        assert custom.try_poll() is None
        assert default.get("x").payload == b"default" and not default.get("x").in_flight


# -- the dequeue statement uses its index -----------------------------------------------------


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


@pytest.mark.slow
def test_try_poll_many_uses_the_kind_scheduled_index(database_url: str) -> None:
    q = Queries("delayed_queue")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO delayed_queue ("pKey", "pKind", payload, "scheduledAt",
                                       "scheduledAtInitially", "createdAt")
            SELECT 'k' || i, CASE WHEN i % 5 = 0 THEN 'other' ELSE 'test' END, '\\x00',
                   t, t, 0
            FROM generate_series(1, 50000) AS i,
                 LATERAL (SELECT CASE WHEN i <= 5 THEN 1000 ELSE 9e15::bigint + i END AS t) AS s
        """)
        conn.execute("ANALYZE delayed_queue")
        params = {"kinds": ["test", "other"], "lows": [None, None], "want_next": True,
                  "limit": 100, "lock": "L",
                  "lease_ms": 60_000, "now": None}
        row = conn.execute("EXPLAIN (FORMAT JSON) " + q["try_poll_many"], params).fetchone()
        nodes = list(plan_nodes(row[0][0]["Plan"]))
        on_queue = [(n["Node Type"], n.get("Index Name")) for n in nodes
                    if n.get("Relation Name") == "delayed_queue"]
        assert ("Seq Scan", None) not in on_queue, json.dumps(row[0], indent=1)
        assert any(name == "delayed_queue__KindPlusScheduledAtIndex" for _, name in on_queue)
        got = conn.execute(q["try_poll_many"], params).fetchall()
        got = [r for r in got if r[0] is not None]  # the last row only carries next_due
        assert sorted(r[1] for r in got) == ["k1", "k2", "k3", "k4", "k5"]


def generic_plan(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]
                 ) -> dict[str, Any]:
    """The plan PostgreSQL caches for ``query`` under ``plan_cache_mode=force_generic_plan``
    (how the consumer pool runs it): PREPARE with ``$n`` placeholders, EXPLAIN EXECUTE."""
    prepared, name, names = as_prepared(query)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE {name} AS {prepared}")
    args = ", ".join(["%s"] * len(names))
    with conn.transaction(force_rollback=True):  # EXPLAIN only, but keep the table untouched
        cur = psycopg.ClientCursor(conn)
        row = cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({args})",
                          [params[n] for n in names]).fetchone()
    conn.execute(f"DEALLOCATE {name}")
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


HOT_PATH_PARAMS = {
    "kinds": ["test", "other"], "lows": [None, 1000], "starts": [None, 500],
    "floors": [2000, 1000],
    "want_next": True, "limit": 8, "lock": "L",
    "lease_ms": 60_000, "now": None, "id": 5, "ids": [1, 2, 3], "locks": ["a", "b", "c"],
    "delay_ms": 0, "key": "k5", "kind": "test", "payload": b"x", "scheduled_at": None,
    "expected_initially": 0, "expected_created": 0, "to_kind": "dead", "retention_ms": 1000,
    "payloads": [None, None, None], "lock_set": ["a", "b", "c"]}


@pytest.mark.parametrize("statement", [
    "try_poll_many", "probe_below_watermark", "ack", "ack_many", "ack_lock", "extend_lease",
    "release", "dead_letter", "offer_select_for_update", "offer_cas_update"])
@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed-empty"])
def test_hot_path_plans_made_on_an_empty_table_still_use_an_index(database_url: str,
                                                                  statement: str,
                                                                  analyzed: bool) -> None:
    """A worker that starts before its publishers plans on an empty table (never analyzed, or
    analyzed once everything was acked: reltuples 0), and keeps that generic plan as the table
    grows: on the consumer pool's own connections it must still be a bounded index path (a
    seq scan there made every end-to-end poll cost 2-3 ms)."""
    if analyzed:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("""INSERT INTO delayed_queue ("pKey", "pKind", payload, "scheduledAt",
                                "scheduledAtInitially", "createdAt")
                            SELECT 'k' || i, 'test', '\\x00', i, i, 0
                            FROM generate_series(1, 2000) AS i""")
            conn.execute("DELETE FROM delayed_queue")
            conn.execute("VACUUM ANALYZE delayed_queue")
    with Database(database_url, max_size=1) as db, db.relaxed_pool.connection() as conn:
        plan = generic_plan(conn, Queries("delayed_queue")[statement], HOT_PATH_PARAMS)
    on_queue = [n for n in plan_nodes(plan) if n.get("Relation Name") == "delayed_queue"]
    assert "Seq Scan" not in [n["Node Type"] for n in on_queue], json.dumps(plan, indent=1)
    # An index scan with no condition walks the whole index, dead entries included: ack_many's
    # generic plan did that inside a nested loop (662 ms per ack after 10 minutes under a
    # held snapshot).
    unbounded = [n.get("Index Name") for n in on_queue
                 if n["Node Type"] in ("Index Scan", "Index Only Scan") and "Index Cond" not in n]
    assert unbounded == [], json.dumps(plan, indent=1)


@pytest.mark.slow
@pytest.mark.parametrize(("statement", "index"), [
    ("try_poll_many", "delayed_queue__KindPlusScheduledAtIndex"),
    ("probe_below_watermark", "delayed_queue__KindPlusScheduledAtIndex"),
    ("ack", "delayed_queue__LockUuidPlusIdIndex"),
    # PostgreSQL 18 reaches these two through the primary key on "id" = ANY(ids), as bounded
    # (PostgreSQL 15 through the lock index); both are one index probe per id.
    ("ack_many", "delayed_queue__LockUuidPlusIdIndex|delayed_queue_pkey"),
    ("extend_lease", "delayed_queue__LockUuidPlusIdIndex"),
    ("release", "delayed_queue__LockUuidPlusIdIndex|delayed_queue_pkey"),
    ("offer_select_for_update", "delayed_queue__PKeyPlusKindUniqueIndex"),
    ("offer_cas_update", "delayed_queue__PKeyPlusKindUniqueIndex"),
])
def test_hot_path_generic_plans_use_their_index(database_url: str, statement: str,
                                                index: str) -> None:
    """The consumer/publish pool forces generic plans (no re-planning per call); each of its
    statements must still reach rows through an index on a large table, never a seq scan."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO delayed_queue ("pKey", "pKind", payload, "scheduledAt",
                                       "scheduledAtInitially", "createdAt")
            SELECT 'k' || i, CASE WHEN i % 5 = 0 THEN 'other' ELSE 'test' END, '\\x00', t, t, 0
            FROM generate_series(1, 50000) AS i,
                 LATERAL (SELECT CASE WHEN i <= 5 THEN 1000 ELSE 9e15::bigint + i END AS t) AS s
        """)
        conn.execute("ANALYZE delayed_queue")
        plan = generic_plan(conn, Queries("delayed_queue")[statement], HOT_PATH_PARAMS)
    on_queue = [(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan)
                if n.get("Relation Name") == "delayed_queue"]
    assert ("Seq Scan", None) not in on_queue, json.dumps(plan, indent=1)
    assert any(name in index.split("|") for _, name in on_queue), on_queue


@pytest.mark.parametrize("statement", ["try_poll_many", "probe_below_watermark"])
def test_scans_stay_ordered_after_an_analyze_that_saw_few_live_rows(database_url: str,
                                                                    statement: str) -> None:
    """Under a held snapshot ANALYZE counts a few live rows among tens of thousands of dead
    ones still in the index; the generic plan re-made then must still scan (pKind, scheduledAt)
    in order and stop at LIMIT. It took a bitmap scan (every entry of the range, dead ones
    included), or one of the pKey index on its second column plus a sort, and found the rows
    to update through the lock index on its second column: polls went from 3 to 15-100 ms and
    the held-snapshot benchmark stalled for up to 60 s, until the next ANALYZE."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO delayed_queue ("pKey", "pKind", payload, "scheduledAt",
                                       "scheduledAtInitially", "createdAt")
            SELECT 'k' || i, 'test', '\\x00', 1000000 + i, 1000000 + i, 0
            FROM generate_series(1, 60000) AS i""")
        conn.execute("DELETE FROM delayed_queue WHERE id % 3000 <> 0")  # dead, not vacuumed
        conn.execute("ANALYZE delayed_queue")
        reltuples = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'delayed_queue'::regclass").fetchone()
        assert reltuples is not None and reltuples[0] <= 100  # the statistics of the incident
    with Database(database_url, max_size=1) as db, db.relaxed_pool.connection() as conn:
        plan = generic_plan(conn, Queries("delayed_queue")[statement], HOT_PATH_PARAMS)
    nodes = list(plan_nodes(plan))
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes
             if n.get("Relation Name") == "delayed_queue" and "Scan" in n["Node Type"]}
    # Ordered scans of (pKind, scheduledAt) that stop at LIMIT, and the update's TID lookup.
    allowed = {("Index Scan", "delayed_queue__KindPlusScheduledAtIndex"),
               ("Index Only Scan", "delayed_queue__KindPlusScheduledAtIndex"),
               ("Tid Scan", None)}
    assert scans and scans <= allowed, json.dumps(plan, indent=1)
    assert "Sort" not in {n["Node Type"] for n in nodes}, json.dumps(plan, indent=1)


# -- NOTIFY wake-ups ---------------------------------------------------------------------------


class Listener:
    """A LISTENing connection; ``until`` collects notifications up to a sentinel payload."""

    def __init__(self, url: str, table: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(Queries(table)["listen"])
        self.channel = notify_channel(table)

    def until(self, sentinel_kind: str) -> list[str]:
        got: list[str] = []
        for note in self.conn.notifies(timeout=WAIT_S):
            assert note.channel == self.channel
            if note.payload.startswith(f"{sentinel_kind}:"):
                return got
            got.append(note.payload)
        raise AssertionError(f"no sentinel notification; got {got}")


@pytest.mark.parametrize("table", ["delayed_queue", "jobs2"])
def test_notify_on_insert_and_release_only(database_url: str, table: str) -> None:
    listener = Listener(database_url, table)
    with DelayedQueue(database_url, kind="test", table=table, acquire_timeout=60) as q:
        sentinel = q.with_kind("sentinel")

        def notes_after(action: Any) -> list[str]:
            action()
            sentinel.offer(uuid.uuid4().hex, b"")
            return listener.until("sentinel")

        now = q.now()
        at = [now - timedelta(seconds=s) for s in (3, 2, 1)]
        ms = [int(a.timestamp() * 1000) for a in at]
        assert notes_after(lambda: q.offer("a", b"", at[2])) == [f"test:{ms[2]}"]
        batch = [Offer("b", b"", at[1]), Offer("c", b"", at[0])]
        assert sorted(notes_after(lambda: q.offer_batch(batch))) == [
            f"test:{ms[0]}", f"test:{ms[1]}"], "every due time of the batch, each once"
        assert sorted(notes_after(lambda: q.with_kind("two").offer_batch(batch))) == [
            f"two:{ms[0]}", f"two:{ms[1]}"]
        held: list[Any] = []
        assert notes_after(lambda: held.extend(q.try_poll_many(3))) == [], "acquire is silent"
        assert notes_after(lambda: q.extend_lease([held[0].lock])) == [], "extension is silent"
        assert notes_after(lambda: q.offer("a", b"", at[2], can_update=False)) == []
        assert notes_after(lambda: held[0].ack()) == []
        released = notes_after(lambda: q.release(held[1:]))
        # PostgreSQL folds identical payloads of one transaction into one notification.
        assert set(released) == {f"test:{q.get(e.key).scheduled_at_ms}" for e in held[1:]}
    listener.conn.close()


def raw_insert(conn: psycopg.Connection[Any], table: str, key: str, kind: str, at: int) -> None:
    """An INSERT of the kind an operator or another publisher writes by hand."""
    conn.execute(
        psycopg.sql.SQL('INSERT INTO {} ("pKey", "pKind", payload, "scheduledAt", '
                        '"scheduledAtInitially", "createdAt") VALUES (%s, %s, %s, %s, %s, 0)')
        .format(psycopg.sql.Identifier(table)), (key, kind, b"", at, at))


def test_every_insert_path_notifies_once(database_url: str) -> None:
    """offer() and offer_batch() are announced after their commit (core/queue/announce.py) and the
    insert trigger skips their statements (migration 5); every other insert still notifies
    through the trigger: raw SQL, COPY, and a raw INSERT later in the same transaction as an
    offer's statement (whose own wake-up is the announcer's, not the statement's)."""
    listener = Listener(database_url, "delayed_queue")
    q = Queries("delayed_queue")
    with DelayedQueue(database_url, kind="test") as dq, \
            psycopg.connect(database_url, autocommit=True) as conn:
        def notes_after(action: Any) -> list[str]:
            action()
            dq.with_kind("sentinel").offer(uuid.uuid4().hex, b"")
            return listener.until("sentinel")

        assert notes_after(lambda: dq.offer("a", b"", None)) == [
            f"test:{dq.get('a').scheduled_at_ms}"], "one NOTIFY per offer, not two"
        assert notes_after(lambda: raw_insert(conn, "delayed_queue", "r", "test", 11)) == [
            "test:11"]

        def copy() -> None:
            with conn.cursor().copy('COPY delayed_queue ("pKey", "pKind", payload, '
                                    '"scheduledAt", "scheduledAtInitially", "createdAt") '
                                    "FROM STDIN") as cp:
                cp.write_row(("c1", "test", b"", 13, 13, 0))
                cp.write_row(("c2", "test", b"", 12, 12, 0))
        assert sorted(notes_after(copy)) == ["test:12", "test:13"], "every due time (mig. 14)"

        def offer_then_raw_in_one_transaction() -> None:
            with conn.transaction():
                conn.execute(q["offer_insert"], {"key": "t1", "kind": "test", "payload": b"",
                                                 "scheduled_at": 21, "now": None,
                                                 "announce": False, "pending": []})
                raw_insert(conn, "delayed_queue", "t2", "test", 22)
        assert notes_after(offer_then_raw_in_one_transaction) == ["test:22"]
        assert notes_after(lambda: dq.offer("a", b"", None, can_update=False)) == [], \
            "a key that exists inserts nothing and notifies nothing"
    listener.conn.close()


def test_migration_5_upgrades_a_live_table(empty_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table at version 4 (trigger without WHEN) keeps its rows and wakes its listeners after
    `delayq migrate` installs the skipping trigger; publishes keep notifying exactly once."""
    old = [m for m in MIGRATIONS if m.version < 5]
    with Database(empty_db, max_size=1) as db:
        monkeypatch.setattr("delayq_transport.core.schema.migrations.MIGRATIONS", old)
        assert migrate(db, "delayed_queue") == [m.version for m in old]
        with DelayedQueue(db, kind="test", ensure_schema=False) as dq:
            dq.offer("before", b"x", None)  # the new statement on the old trigger
        monkeypatch.undo()
        listener = Listener(empty_db, "delayed_queue")
        assert 5 in migrate(db, "delayed_queue")
        with DelayedQueue(db, kind="test") as dq:
            assert dq.get("before") is not None
            dq.offer("after", b"x", None)
            dq.with_kind("sentinel").offer("s", b"")
            assert listener.until("sentinel") == [f"test:{dq.get('after').scheduled_at_ms}"]
        listener.conn.close()


def _schedule_relations(url: str) -> dict[str, list[str]]:
    """The scheduling tables of every name, with their primary key's index, and their rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT c.relname::text FROM pg_class AS c WHERE c.relkind = 'r' AND c.relname "
            "IN ('delayq_beat_entries', 'delayq_beat_installed', 'delayq_schedule_entries', "
            "'delayq_schedule_installed') ORDER BY 1").fetchall()]
        out = {}
        for table in tables:
            keys = conn.execute("SELECT i.indexrelid::regclass::text FROM pg_index AS i "
                                "WHERE i.indrelid = %s::regclass", (table,)).fetchall()
            rows = conn.execute(f'SELECT "tableName" || \'/\' || "name" FROM "{table}" '
                                "ORDER BY 1").fetchall()
            out[table] = [k for (k,) in keys] + [r for (r,) in rows]
        return out


def test_migration_16_renames_the_schedule_tables_with_their_rows(
        empty_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database at version 14 keeps its scheduling entries and ledger under the new names;
    a queue table migrated from nothing afterwards (whose migration 10 makes the old tables
    again) ends with the same two tables, nothing under the old names, no row lost."""
    from delayq_transport.core.integrations import PeriodicStore

    old = [m for m in MIGRATIONS if m.version < 16]
    with Database(empty_db, max_size=1) as db:
        monkeypatch.setattr("delayq_transport.core.schema.migrations.MIGRATIONS", old)
        migrate(db, "delayed_queue")
        with psycopg.connect(empty_db, autocommit=True) as conn:
            conn.execute('INSERT INTO "delayq_beat_entries" VALUES '
                         "('delayed_queue', 'digest', NULL, false, 1)")
            conn.execute('INSERT INTO "delayq_beat_installed" VALUES '
                         "('delayed_queue', 'tick', 'celery', 'h', 2, 1, 1)")
        monkeypatch.undo()
        assert migrate(db, "delayed_queue") == [m.version for m in MIGRATIONS if m.version >= 16]
        renamed = {"delayq_schedule_entries": ["delayq_schedule_entries_pkey",
                                               "delayed_queue/digest"],
                   "delayq_schedule_installed": ["delayq_schedule_installed_pkey",
                                                 "delayed_queue/tick"]}
        assert _schedule_relations(empty_db) == renamed
        assert migrate(db, "q_two") == [m.version for m in MIGRATIONS]
        assert _schedule_relations(empty_db) == renamed
        store = PeriodicStore(db, "delayed_queue")
        assert [r.name for r in store.entries()] == ["digest"]
        assert [r.name for r in store.installed()] == ["tick"]


def test_offer_statement_does_not_call_the_trigger(database_url: str) -> None:
    """What migration 5 saves: the offer statement never runs the trigger function (PostgreSQL
    would fold a second identical NOTIFY, so only the function's call count shows it)."""
    q = Queries("delayed_queue")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET track_functions = 'all'")

        def calls() -> int:
            row = conn.execute("SELECT pg_stat_get_xact_function_calls("
                               "'delayed_queue__notify'::regproc)").fetchone()
            return int(row[0] or 0) if row else 0

        with conn.transaction():
            conn.execute(q["offer_insert"], {"key": "o", "kind": "test", "payload": b"",
                                             "scheduled_at": 5, "now": None,
                                             "announce": False, "pending": []})
            assert calls() == 0
            raw_insert(conn, "delayed_queue", "r", "test", 6)
            assert calls() == 1
