"""Each migration's declared lock and rewrite (``Migration.lock``/``rewrites``, which
docs/how-to/upgrade.md lists) checked against PostgreSQL: the migration is applied in an open
transaction on a table holding rows, and another session reads ``pg_locks`` for what it holds
on the relations that existed before it; the relfilenodes tell whether anything was rewritten."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from conftest import create_database, drop_database

from delayq_transport.core.db.queries import Queries
from delayq_transport.core.schema import LOCK_MODES, MIGRATIONS

#: pg_locks' names of the lock modes, as LOCK_MODES spells them.
PG_MODES = {
    "AccessShareLock": "ACCESS SHARE", "RowShareLock": "ROW SHARE",
    "RowExclusiveLock": "ROW EXCLUSIVE", "ShareUpdateExclusiveLock": "SHARE UPDATE EXCLUSIVE",
    "ShareLock": "SHARE", "ShareRowExclusiveLock": "SHARE ROW EXCLUSIVE",
    "ExclusiveLock": "EXCLUSIVE", "AccessExclusiveLock": "ACCESS EXCLUSIVE",
}
WHERE = "WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'i', 'S')"
RELATIONS = f"SELECT c.oid::int, pg_relation_filenode(c.oid) FROM pg_class AS c {WHERE}"
NAMES = f"SELECT c.oid::int, c.relname::text FROM pg_class AS c {WHERE}"


def _strongest(modes: list[str]) -> str:
    return max(modes, key=LOCK_MODES.index, default="none")


@pytest.fixture
def empty_db() -> Iterator[str]:
    name = f"delayq_e_{uuid.uuid4().hex[:12]}"
    yield create_database(name)
    drop_database(name)


def test_each_migration_takes_the_lock_it_declares_and_rewrites_nothing(empty_db: str) -> None:
    q = Queries("delayed_queue")
    seen: dict[int, tuple[str, set[int]]] = {}
    with psycopg.connect(empty_db, autocommit=True) as conn, \
            psycopg.connect(empty_db, autocommit=True) as observer:
        conn.execute(q["migrations_ensure"])
        pid = conn.info.backend_pid
        for migration in MIGRATIONS:
            before = dict(observer.execute(RELATIONS).fetchall())
            names = dict(observer.execute(NAMES).fetchall())
            with conn.transaction():
                migration.apply(conn, q)
                held = observer.execute(
                    "SELECT relation::int, mode FROM pg_locks WHERE pid = %s "
                    "AND locktype = 'relation' AND granted", (pid,)).fetchall()
                after = dict(conn.execute(RELATIONS).fetchall())  # its own uncommitted view
            lock = _strongest([PG_MODES[mode] for rel, mode in held if rel in before])
            on = {names[rel] for rel, mode in held if rel in before and PG_MODES[mode] == lock}
            rewritten = {oid for oid, node in before.items()  # a dropped one is not
                         if after.get(oid, node) != node}
            seen[migration.version] = (lock, rewritten)
            if lock != "none":
                assert on == ({"delayed_queue"} if migration.lock_on == "the queue table"
                              else set(migration.lock_on.split(" and "))), (migration.version, on)
            if migration.version == 1:  # later migrations meet a table with rows and indexes
                conn.execute('INSERT INTO delayed_queue ("pKey", "pKind", "payload", '
                             '"scheduledAt", "scheduledAtInitially", "createdAt") '
                             "SELECT 'k' || i, 'celery', '\\x00', i, i, i "
                             "FROM generate_series(1, 2000) AS i")
    declared = {m.version: (m.lock, m.rewrites) for m in MIGRATIONS}
    assert {v: lock for v, (lock, _) in seen.items()} == \
        {v: lock for v, (lock, _) in declared.items()}
    assert {v: bool(rewritten) for v, (_, rewritten) in seen.items()} == \
        {v: rewrites for v, (_, rewrites) in declared.items()}
