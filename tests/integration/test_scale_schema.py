"""Migration 4 (per-table autovacuum settings) upgrades a live queue: rows waiting and in flight,
a pg_dump-like snapshot and an uncommitted insert open while `delayq migrate` runs."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import psycopg
from _workers import WAIT_S

from delayq_transport import DelayedQueue

AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=1000",
    "autovacuum_vacuum_insert_scale_factor=0.01", "autovacuum_vacuum_insert_threshold=1000",
    "autovacuum_analyze_scale_factor=0.01", "autovacuum_analyze_threshold=1000",
}


def reloptions(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'delayed_queue'::regclass"
                           ).fetchone()
    return set(row[0] or []) if row else set()


def test_migration_4_upgrades_a_live_table(database_url: str) -> None:
    assert AUTOVACUUM <= reloptions(database_url), "fresh schemas get the settings"
    with psycopg.connect(database_url, autocommit=True) as conn:  # back to a version-3 table
        conn.execute("ALTER TABLE delayed_queue RESET (" + ", ".join(
            o.split("=")[0] for o in AUTOVACUUM) + ")")
        conn.execute("DELETE FROM delayq_migrations WHERE version = 4")
    assert not reloptions(database_url) & AUTOVACUUM
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
        assert AUTOVACUUM <= reloptions(database_url)
        assert q.ack_many(held) == 3, "in-flight deliveries still ack by their lock"
        keys = {e.key for e in q.try_poll_many(100)}
        assert keys == {f"due{i}" for i in range(7)} | {"w"}
        assert q.count_waiting() == 10
