"""Publishing in the caller's transaction behind PgBouncer in transaction pooling (issue 34):
the application's connection and delayq's both go through the pooler, which lends another
server session to every transaction. The same guarantees hold as on a direct server: invisible
until the commit, the wake-up delivered at the commit, nothing after a rollback or a
rolled-back savepoint, delayq's pool untouched, another database refused, and kombu's producer
publishing through the transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import psycopg
import psycopg2
import pytest
from conftest import BASE_URL, create_database, drop_database

import delayq_transport  # noqa: F401  (registers the delayq+ scheme)
from delayq_transport import DelayedQueue, TransactionRefused, transaction
from delayq_transport.core.db.queries import notify_channel
from delayq_transport.transport.backend import Backend

from .pgbouncer import PgBouncer


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    made = PgBouncer(BASE_URL, mode="transaction", pool_size=4).start()
    yield made
    made.stop()


def connect(driver: str, url: str) -> Any:
    return psycopg.connect(url) if driver == "psycopg" else psycopg2.connect(url)


def committed(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {r[0] for r in conn.execute('SELECT "pKey" FROM delayed_queue').fetchall()}


def heard_until_marker(listener: psycopg.Connection[Any], url: str) -> list[str]:
    """Notifications committed before a marker NOTIFY sent now (which then arrives too)."""
    marker = uuid.uuid4().hex
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (notify_channel("delayed_queue"), marker))
    got = []
    for note in listener.notifies(timeout=10):
        if note.payload == marker:
            return got
        got.append(note.payload)
    raise AssertionError(f"the marker NOTIFY never arrived (got {got})")


def requests(queue: DelayedQueue) -> int:
    pools = [queue.db.pool] + ([queue.db.relaxed_pool] if queue.db.has_relaxed_pool else [])
    return sum(p.get_stats().get("requests_num", 0) for p in pools)


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_the_guarantees_hold_through_a_transaction_pooler(
        bouncer: PgBouncer, database_url: str, driver: str) -> None:
    pooled = bouncer.url(database_url)
    listener = psycopg.connect(database_url, autocommit=True)  # direct: LISTEN needs a session
    listener.execute(f'LISTEN "{notify_channel("delayed_queue")}"')
    with DelayedQueue(pooled, kind="k") as queue:
        assert queue.db.transaction_pooling
        app = connect(driver, pooled)
        before = requests(queue)
        with transaction(app):
            queue.offer("a", b"1")
            queue.offer_batch([("b", b"2", None)])
            app.cursor().execute("SAVEPOINT s")
            queue.offer("dropped", b"3")
            app.cursor().execute("ROLLBACK TO SAVEPOINT s")
        assert requests(queue) == before
        assert committed(database_url) == set()
        assert heard_until_marker(listener, database_url) == []
        app.commit()
        assert committed(database_url) == {"a", "b"}
        assert [p.split(":")[0] for p in heard_until_marker(listener, database_url)] == ["k"]
        with transaction(app):
            queue.offer("rolled-back", b"4")
        app.rollback()
        assert committed(database_url) == {"a", "b"}
        app.close()
    listener.close()


def test_another_database_through_the_same_pooler_is_refused(
        bouncer: PgBouncer, database_url: str) -> None:
    other = f"delayq_other_{uuid.uuid4().hex[:8]}"
    create_database(other)
    try:
        with DelayedQueue(bouncer.url(database_url), kind="k") as queue, \
                psycopg.connect(bouncer.url(other)) as app, transaction(app):
            with pytest.raises(TransactionRefused, match=other):
                queue.offer("x", b"1")
        assert committed(database_url) == set()
    finally:
        drop_database(other)


def test_a_kombu_producer_publishes_in_the_transaction_through_the_pooler(
        bouncer: PgBouncer, database_url: str) -> None:
    pooled = bouncer.url(database_url)
    with kombu.Connection("delayq+" + pooled, transport_options={"polling_interval": 1}) as conn:
        producer = conn.Producer()
        producer.publish({"warm": 1}, routing_key="q", headers={"task": "t", "id": "warm"})
        before = sum(b.db.pool.get_stats().get("requests_num", 0)
                     for b in Backend._registry.values())
        with psycopg.connect(pooled) as app:
            with transaction(app):
                producer.publish({"n": 1}, routing_key="q", declare=[kombu.Queue("q")],
                                 headers={"task": "t", "id": "in-tx"})
            assert sum(b.db.pool.get_stats().get("requests_num", 0)
                       for b in Backend._registry.values()) == before
            assert "in-tx" not in committed(database_url)
            app.commit()
    assert "in-tx" in committed(database_url)
