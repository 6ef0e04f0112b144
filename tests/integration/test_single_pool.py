"""``single_pool`` (issue 26): relaxed statements on the one pool get the relaxed pool's
settings per transaction, and a process holds one connection where it held two."""

from __future__ import annotations

from typing import Any

import psycopg

from delayq_transport import Database, DelayedQueue

SETTINGS = ("synchronous_commit", "plan_cache_mode", "enable_seqscan", "enable_bitmapscan",
            "enable_sort", "jit")


def _shown(db: Database, relaxed: bool) -> dict[str, str]:
    def work(conn: psycopg.Connection[Any]) -> dict[str, str]:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in SETTINGS}

    return db.run(work, relaxed=relaxed)


def test_relaxed_statements_see_the_relaxed_pools_settings(database_url: str) -> None:
    with Database(database_url) as two, Database(database_url, single_pool=True) as one:
        assert _shown(one, relaxed=True) == _shown(two, relaxed=True)
        assert _shown(one, relaxed=True)["synchronous_commit"] == "off"
        # ... for that transaction only: the same connection serves durable statements next.
        assert _shown(one, relaxed=False) == _shown(two, relaxed=False)
        assert _shown(one, relaxed=False)["synchronous_commit"] == "on"


def test_a_publisher_holds_one_connection(database_url: str) -> None:
    with Database(database_url, min_size=0, max_size=4, single_pool=True) as db:
        queue = DelayedQueue(db, kind="k", relaxed_consumer_commits=True)
        # Wake-ups go out on the publishing connection (core/queue/announce.py); only a trailing one
        # with nobody publishing uses an idle pooled connection, at the window's end: not here.
        queue.announcer.window_s = 60.0
        for i in range(20):
            queue.offer(f"k{i}", b"x", durable=i % 2 == 0)
        got, _ = queue.poll(20)
        assert len(got) == 20 and queue.ack_many(got) == 20
        assert db.pool.get_stats()["pool_size"] == 1
        assert db.relaxed_pool is db.pool  # no second pool was opened
