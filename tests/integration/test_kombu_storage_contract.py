"""The kombu transport without a Celery worker: what each kombu operation does to the table.

Celery-level tests prove the URL swap works; these pin the storage contract underneath it
(row key, kind, scheduledAt, lease, release-in-place) so a regression names the operation that
broke instead of a task that did not run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

import kombu
import psycopg
import pytest

from delayq_transport.core import InvalidInput
from delayq_transport.formats import celery as msg

pytestmark = pytest.mark.timeout(60)
pytest_plugins = ("_kombu_env",)

Connect = Callable[..., kombu.Connection]


Stored = Callable[[], list[dict[str, Any]]]


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Bounded wait on an observable (the ack flush is asynchronous by design)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_row_key_kind_payload_and_scheduled_at(kombu_connect: Connect, stored: Stored):
    """Task messages are keyed by task id in kind queue[+bucket], due at their eta header."""
    eta = datetime.now(UTC) + timedelta(minutes=5)
    with kombu_connect() as conn, closing(conn.SimpleQueue("work")) as q:
        q.put({"n": 1}, headers={"task": "t.x", "id": "tid-1", "eta": eta.isoformat()},
              priority=6)
        q.put({"n": 2})
    task_row, plain_row = stored()
    assert task_row["pKey"] == "tid-1"
    assert task_row["pKind"] == msg.kind_for("work", 6) != "work"
    assert task_row["scheduledAt"] == task_row["scheduledAtInitially"]
    assert abs(task_row["scheduledAt"] - eta.timestamp() * 1000) <= 1
    assert task_row["lockUuid"] is None
    stored = msg.decode(bytes(task_row["payload"]))
    assert stored["headers"]["id"] == "tid-1" and stored["properties"]["priority"] == 6
    # Without a task id the delivery tag is the key; priority 0 is the bare queue name.
    assert plain_row["pKind"] == "work"
    plain = msg.decode(bytes(plain_row["payload"]))
    assert plain_row["pKey"] == plain["properties"]["delivery_tag"]


@pytest.mark.alone  # its 1.5 s window: 6 pytest processes on 2 cores delivered it early, twice
def test_eta_message_is_not_delivered_before_it_is_due(kombu_connect: Connect):
    with kombu_connect() as conn, closing(conn.SimpleQueue("later")) as q:
        # After connecting: the first connection migrates this test's fresh table, which a busy
        # box can spend most of the 1.0 s "not yet due" window on.
        eta = datetime.now(UTC) + timedelta(seconds=1.5)
        q.put("soon", headers={"eta": eta.isoformat()})
        with pytest.raises(q.Empty):
            q.get(timeout=0.5)
        message = q.get(timeout=5)
        received = datetime.now(UTC)
        assert message.payload == "soon"
        assert received >= eta - timedelta(milliseconds=20), (received, eta)
        message.ack()


def test_delivery_leases_the_row_and_ack_deletes_it(kombu_connect: Connect, stored: Stored):
    with kombu_connect() as conn, closing(conn.SimpleQueue("acks")) as q:
        for i in range(5):
            q.put(i)
        got = [q.get(timeout=2) for _ in range(5)]
        held = stored()
        assert len(held) == 5 and all(r["lockUuid"] for r in held)
        assert all(r["scheduledAt"] > r["scheduledAtInitially"] for r in held)  # leased
        for message in got:
            message.ack()
        wait_for(lambda: not stored(), what="acks to delete the rows")
    assert sorted(m.payload for m in got) == list(range(5))


def test_requeue_releases_the_row_in_place(kombu_connect: Connect, stored: Stored):
    """No copy: the same row comes back, flagged redelivered."""
    with kombu_connect() as conn, closing(conn.SimpleQueue("requeue")) as q:
        q.put("again")
        first = q.get(timeout=2)
        assert not first.delivery_info["redelivered"]
        [row] = stored()
        first.requeue()
        [released] = stored()
        assert released["id"] == row["id"] and released["lockUuid"] is None
        second = q.get(timeout=2)
        assert second.payload == "again" and second.delivery_info["redelivered"]
        second.ack()
        wait_for(lambda: not stored(), what="ack")


def test_reject_without_requeue_keeps_a_dead_letter(kombu_connect: Connect, stored: Stored):
    """The row itself moves to ``<queue>.XQ``, kept ``dead_letter_retention`` (0: deleted)."""
    with kombu_connect(dead_letter_retention=3600) as conn, \
            closing(conn.SimpleQueue("reject")) as q:
        q.put("bad")
        message = q.get(timeout=2)
        [held] = stored()
        message.reject(requeue=False)
        [dead] = stored()
        assert dead["id"] == held["id"] and dead["pKind"] == "reject.XQ"
        assert dead["lockUuid"] is None
        assert 3599_000 <= dead["scheduledAt"] - dead["scheduledAtInitially"] <= 3600_000
    with kombu_connect(dead_letter_retention=0) as conn, \
            closing(conn.SimpleQueue("gone")) as q:
        q.put("bad")
        q.get(timeout=2).reject(requeue=False)
        wait_for(lambda: [r["pKind"] for r in stored()] == ["reject.XQ"],
                 what="rejected row deleted")


def test_a_queue_named_like_a_dead_letter_kind_is_refused(kombu_connect: Connect,
                                                          stored: Stored):
    with kombu_connect() as conn, closing(conn.SimpleQueue("mail.XQ")) as q, \
            pytest.raises(InvalidInput, match=r"'mail.XQ'.*dead letters"):
        q.put("x")
    assert stored() == []


def test_closing_a_connection_releases_unacked_messages_at_once(kombu_connect: Connect,
                                                                stored: Stored):
    """A consumer that goes away cleanly hands its messages back now, not after the lease."""
    first = kombu_connect()
    q1 = first.SimpleQueue("handover")
    q1.put("m")
    assert q1.get(timeout=2).payload == "m"
    first.release()
    [row] = stored()
    assert row["lockUuid"] is None
    with kombu_connect() as conn, closing(conn.SimpleQueue("handover")) as q2:
        again = q2.get(timeout=2)  # acquire_timeout is 30 s: only the release explains this
        assert again.payload == "m" and again.delivery_info["redelivered"]
        again.ack()
    assert not stored()


def test_no_ack_consumer_deletes_on_delivery(kombu_connect: Connect, stored: Stored):
    queue = kombu.Queue("noack", routing_key="noack")
    received: list[Any] = []
    with kombu_connect() as conn:
        kombu.Producer(conn.default_channel).publish("x", routing_key="noack", declare=[queue])
        with kombu.Consumer(conn, [queue], no_ack=True,
                            callbacks=[lambda body, m: received.append(body)]):
            conn.drain_events(timeout=2)
    assert received == ["x"]
    assert not stored()


def test_size_and_purge_count_waiting_rows_only(kombu_connect: Connect, stored: Stored):
    """In-flight rows are not 'in the queue' (kombu semantics) and survive a purge."""
    with kombu_connect() as conn:
        queue = kombu.Queue("sized", routing_key="sized")(conn.default_channel)
        producer = kombu.Producer(conn.default_channel)
        for i in range(3):
            producer.publish(i, routing_key="sized", declare=[queue])
        held = queue.get()  # basic_get: exactly one message leaves the queue
        assert held is not None
        assert queue.queue_declare(passive=True).message_count == 2  # exists: rows wait
        assert queue.purge() == 2
        assert queue.queue_declare().message_count == 0  # passive: 404 once empty, as Redis
        [row] = stored()
        assert row["lockUuid"] is not None
        held.ack()
    assert not stored()  # closing flushed the ack


def test_basic_get_ack_is_applied_while_the_channel_stays_open(kombu_connect: Connect,
                                                               stored: Stored):
    """An acked basic_get message must be deleted, not redelivered when its lease runs out."""
    with kombu_connect(acquire_timeout=1) as conn:
        queue = kombu.Queue("got", routing_key="got")(conn.default_channel)
        kombu.Producer(conn.default_channel).publish("once", routing_key="got", declare=[queue])
        message = queue.get()
        assert message is not None and message.payload == "once"
        message.ack()
        wait_for(lambda: not stored(), timeout=3, what="the acked row to be deleted")
        assert queue.get() is None


def test_fanout_reaches_a_queue_bound_by_another_connection(kombu_connect: Connect):
    """Bindings live in the database, so a producer that never declared the queue routes to it."""
    exchange = kombu.Exchange("fan", type="fanout")
    queue = kombu.Queue("fan-listener", exchange=exchange)
    received: list[Any] = []
    with kombu_connect() as consumer_conn, kombu_connect() as producer_conn:
        with kombu.Consumer(consumer_conn, [queue],
                            callbacks=[lambda body, m: (received.append(body), m.ack())]):
            kombu.Producer(producer_conn.default_channel, exchange=exchange).publish("hello")
            consumer_conn.drain_events(timeout=3)
    assert received == ["hello"]


def test_acks_from_many_threads_are_all_applied(kombu_connect: Connect, stored: Stored):
    """Acks are batched per channel; acking from worker threads must lose none."""
    n = 60
    with kombu_connect() as conn, closing(conn.SimpleQueue("threads")) as q:
        for i in range(n):
            q.put(i)
        got = [q.get(timeout=2) for _ in range(n)]
        chunks = [got[i::4] for i in range(4)]
        threads = [threading.Thread(target=lambda c=c: [m.ack() for m in c]) for c in chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_for(lambda: not stored(), what="all threaded acks applied")
    assert sorted(m.payload for m in got) == list(range(n))


def _publishing_pool(kombu_db: str, table: str, since: Any) -> str:
    """The pool (application_name) of the connection whose last statement inserted into
    ``table`` (or announced the insert after its commit, on the same connection:
    core/queue/announce.py): pools differ only in ``synchronous_commit``, so this is the durability
    used. Only sessions opened ``since`` count: a closed pool's backend of an earlier test can
    linger in pg_stat_activity for a moment after its client left."""
    with psycopg.connect(kombu_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, current_setting('synchronous_commit') FROM pg_stat_activity"
            " WHERE (query ~ ('^(WITH ins AS \\(\\s*)?INSERT INTO ' || %s)"
            "        OR query ~ '^SELECT set_config\\(''synchronous_commit'', ''off'', true\\), "
            "pg_notify')"
            " AND pid <> pg_backend_pid() AND backend_start >= %s"
            " AND datname = current_database()",  # not the other tests' (pytest-xdist)
            (f'"{table}"', since)).fetchall()
    names = {name for name, _ in rows}
    assert len(names) == 1, rows
    return names.pop()


@pytest.mark.parametrize(("options", "pool", "synchronous_commit"), [
    ({}, "delayq-relaxed", "off"),
    ({"durable_publish": True}, "delayq", "on"),
])
def test_publish_durability_follows_durable_publish(
    kombu_connect: Connect, kombu_db: str, kombu_table: str, stored: Stored,
    options: dict[str, Any], pool: str, synchronous_commit: str,
):
    """Default publishes commit without the WAL flush wait (Redis-like durability);
    ``durable_publish=True`` sends them through the pool that waits for it."""
    with psycopg.connect(kombu_db) as clock:
        since = clock.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    with kombu_connect(**options) as conn, closing(conn.SimpleQueue("durability")) as q:
        q.put("m")
        assert _publishing_pool(kombu_db, kombu_table, since) == pool
        backend = conn.transport.backend
        got = backend.db.run(lambda c: c.execute("SHOW synchronous_commit").fetchone()[0],
                             relaxed=pool == "delayq-relaxed")
        assert got == synchronous_commit
        assert q.get(timeout=2).payload == "m"


def test_messages_fetched_for_a_cancelled_queue_are_released_not_delivered(
    kombu_connect: Connect, stored: Stored,
):
    """The event loop plans a poll, a helper thread runs it, the loop delivers: a queue
    cancelled in between gets its rows back at once instead of holding them for a lease."""
    received: list[Any] = []
    queue = kombu.Queue("gone", routing_key="gone")
    with kombu_connect() as conn:
        channel = conn.default_channel
        kombu.Producer(channel).publish("x", routing_key="gone", declare=[queue])
        consumer = kombu.Consumer(channel, [queue], callbacks=[lambda b, m: received.append(b)])
        consumer.consume()
        sub = channel.subscription
        want = sub.want(10)  # the loop thread plans: the prefetch window has room
        assert want > 0
        polled = conn.transport.session.fetch(sub, want)  # the poller thread fetches
        assert [len(polled.envs)] == [1]
        [row] = stored()
        assert row["lockUuid"] == polled.envs[0].lock  # leased by the fetch
        consumer.cancel()
        assert channel.deliver(sub, polled.envs) == 0
        [row] = stored()
        assert row["lockUuid"] is None and received == []
        with kombu.Consumer(channel, [queue], callbacks=[lambda b, m: (received.append(b),
                                                                       m.ack())]):
            conn.drain_events(timeout=2)  # lease is 30 s: only the release explains this
    assert received == ["x"]
