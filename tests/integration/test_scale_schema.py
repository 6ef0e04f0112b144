"""The queue table's per-table settings upgrade a live queue: rows waiting and in flight, a
pg_dump-like snapshot and an uncommitted insert open while `delayq migrate` runs. Migration 4:
autovacuum settings; migration 6: fillfactor (issue 27)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest
from _workers import WAIT_S

from delayq_transport import DelayedQueue

AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=1000",
    "autovacuum_vacuum_insert_scale_factor=0.01", "autovacuum_vacuum_insert_threshold=1000",
    "autovacuum_analyze_scale_factor=0.01", "autovacuum_analyze_threshold=1000",
}
FILLFACTOR = {"fillfactor=50"}


def reloptions(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'delayed_queue'::regclass"
                           ).fetchone()
    return set(row[0] or []) if row else set()


@pytest.mark.parametrize(("version", "options"), [(4, AUTOVACUUM), (6, FILLFACTOR)])
def test_a_table_setting_migration_upgrades_a_live_table(
        database_url: str, version: int, options: set[str]) -> None:
    assert options <= reloptions(database_url), "fresh schemas get the settings"
    with psycopg.connect(database_url, autocommit=True) as conn:  # back to before the migration
        conn.execute("ALTER TABLE delayed_queue RESET (" + ", ".join(
            o.split("=")[0] for o in options) + ")")
        conn.execute("DELETE FROM delayq_migrations WHERE version = %s", (version,))
    assert not reloptions(database_url) & options
    with DelayedQueue(database_url, kind="test", ensure_schema=False) as q:
        now = q.now()
        for i in range(10):
            q.offer(f"due{i}", b"d", now - timedelta(seconds=i))
            q.offer(f"later{i}", b"l", now + timedelta(hours=1))
        held = q.try_poll_many(3)
        dump = psycopg.connect(database_url)  # pg_dump: one snapshot, ACCESS SHARE
        dump.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        dump.execute("SELECT count(*) FROM delayed_queue").fetchone()
        writer = psycopg.connect(database_url)  # a publish still in its transaction
        writer.execute("""INSERT INTO delayed_queue ("pKey", "pKind", payload, "scheduledAt",
                          "scheduledAtInitially", "createdAt") VALUES ('w', 'test', '', 0, 0, 0)""")
        try:
            done = subprocess.run(
                [sys.executable, "-c", "from delayq_transport.cli.main import main; main()",
                 "--database-url", database_url, "migrate"],
                capture_output=True, text=True, timeout=WAIT_S, check=False)
            assert done.returncode == 0, done.stderr
            writer.commit()
        finally:
            dump.close()
            writer.close()
        assert options <= reloptions(database_url)
        assert q.ack_many(held) == 3, "in-flight deliveries still ack by their lock"
        keys = {e.key for e in q.try_poll_many(100)}
        assert keys == {f"due{i}" for i in range(7)} | {"w"}
        assert q.count_waiting() == 10


def _pages(url: str) -> dict[str, int]:
    """Each row's heap page, by key."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("""SELECT "pKey", (ctid::text::point)[0]::int FROM delayed_queue"""
                            ).fetchall()
    return dict(rows)


def test_a_lease_keeps_its_row_on_its_page(queue: DelayedQueue, database_url: str) -> None:
    """What migration 6 is for: with pages filled to half, the lease's new version of a
    Celery-sized row fits on the row's own page (logged as the changed bytes only)."""
    for i in range(12):
        queue.offer(f"k{i}", b"x" * 1200)
    before = _pages(database_url)
    assert len(set(before.values())) > 1, "the rows span several pages"
    assert len(queue.try_poll_many(12)) == 12
    assert _pages(database_url) == before
