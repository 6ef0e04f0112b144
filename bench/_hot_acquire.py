"""The alternative measured against the watermark (issue 10, part 2): an acquire that changes
no indexed column, so PostgreSQL can make it a HOT update and leave no index entry behind.

The lease lives in its own column (``lease_until``, not indexed) instead of moving
``scheduledAt``; the table has room on each page (``fillfactor = 50``) for the new version.
Only what the comparison needs is implemented (offer_batch, poll, ack_many), on a table of its
own: a prototype for the benchmark, not a queue delayq ships.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from delayq_transport import Database

LEASE_MS = 60_000
NOW = "(extract(epoch FROM now()) * 1000)::bigint"


class Env:
    """The little of an Envelope the steady run reads."""

    __slots__ = ("id", "lock", "scheduled_at_initially_ms")

    def __init__(self, id: int, lock: str, at: int) -> None:  # noqa: A002
        self.id, self.lock, self.scheduled_at_initially_ms = id, lock, at


class HotAcquireQueue:
    TABLE = "hot_queue"

    def __init__(self, db: Database, kind: str) -> None:
        self.db, self.kind = db, kind
        db.execute(f"""
            CREATE TABLE IF NOT EXISTS {self.TABLE} (
                id bigserial PRIMARY KEY, kind text NOT NULL, key text NOT NULL,
                payload bytea NOT NULL, scheduled_at bigint NOT NULL,
                lease_until bigint, lock text
            ) WITH (fillfactor = 50)""")
        db.execute(f"CREATE INDEX IF NOT EXISTS hot_queue_due ON {self.TABLE} (kind, scheduled_at)")

    def offer_batch(self, items: list[tuple[str, bytes, Any]], can_update: bool = False) -> None:
        keys = [k for k, _, _ in items]
        payloads = [p for _, p, _ in items]
        self.db.execute(f"""
            INSERT INTO {self.TABLE} (kind, key, payload, scheduled_at)
            SELECT %(kind)s, k, p, {NOW} FROM unnest(%(keys)s::text[], %(payloads)s::bytea[])
                AS s(k, p)""", {"kind": self.kind, "keys": keys, "payloads": payloads})

    def poll(self, n: int) -> tuple[list[Env], None]:
        lock = str(uuid.uuid4())

        def work(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            return conn.execute(f"""
                WITH picked AS (
                    SELECT id FROM {self.TABLE}
                    WHERE kind = %(kind)s AND scheduled_at <= {NOW}
                      AND (lease_until IS NULL OR lease_until <= {NOW})
                    ORDER BY scheduled_at LIMIT %(n)s FOR UPDATE SKIP LOCKED)
                UPDATE {self.TABLE} SET lock = %(lock)s, lease_until = {NOW} + {LEASE_MS}
                WHERE id = ANY(ARRAY(SELECT id FROM picked))
                RETURNING id, scheduled_at""",
                {"kind": self.kind, "n": n, "lock": lock}).fetchall()

        rows = self.db.run(work, relaxed=True)
        return [Env(r[0], lock, r[1]) for r in rows], None

    def ack_many(self, envs: list[Env]) -> int:
        return self.db.execute(f"""
            DELETE FROM {self.TABLE} t USING unnest(%(ids)s::bigint[], %(locks)s::text[])
                AS a(id, lock)
            WHERE t.id = a.id AND t.lock = a.lock""",
            {"ids": [e.id for e in envs], "locks": [e.lock for e in envs]}, relaxed=True)


def load_far_rows_hot(url: str, kind: str, n: int, far_ms: int) -> None:
    """The far-future backlog of the steady run, in the prototype's table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            INSERT INTO {HotAcquireQueue.TABLE} (kind, key, payload, scheduled_at)
            SELECT %(kind)s, 'far-' || i, '\\x00', {NOW} + %(far)s + i
            FROM generate_series(1, %(n)s) AS i""", {"kind": kind, "n": n, "far": far_ms})
