"""Issue 27, item 3: with their default options, both adapters send every consumer statement
(acquire, lease extension, ack, release, dead letter) through the pool that commits without
waiting for the WAL flush, and a durable publish through the one that waits.

Which pool ran a statement is read from the server (``pg_stat_activity``: the connection whose
last statement it was, by ``application_name``); the pools differ in ``synchronous_commit``,
checked on their connections. What a crash does to those commits is
tests/topology/test_crash_recovery.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from dramatiq import Message

from delayq_transport.core.queue import DelayedQueue, dead_letters
from delayq_transport.dramatiq.broker import DelayqBroker
from delayq_transport.transport.backend import Backend

#: A fragment of each statement as the server shows it (parameters as $n).
STATEMENTS = {
    "acquire": r"WITH n AS \(SELECT",
    "extend_lease": r'^UPDATE \S+ SET "scheduledAt" = .*"lockUuid" = ANY',
    "release": r'^UPDATE \S+ AS t\s+SET "lockUuid" = NULL',
    "dead_letter": r'^UPDATE \S+ AS t\s+SET "pKind" =',
    "ack_many": r"^DELETE FROM \S+ AS t\s+WHERE t.\"id\" = ANY",
    "ack": r'^DELETE FROM \S+ WHERE "id" = \$1 AND "lockUuid" = \$2',
    # whatever shape the publish statement takes, or the wake-up sent after its commit on the
    # same connection (core/queue/announce.py)
    "offer": r"\bINSERT INTO\b|^SELECT set_config\('synchronous_commit', 'off', true\), pg_notify",
}


def _pool_of(url: str, statement: str) -> str:
    """The pool (application_name) of the one connection whose last statement matches."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, query FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
    names = {name for name, query in rows if re.search(STATEMENTS[statement], query, re.S)}
    assert len(names) == 1, (statement, rows)
    return names.pop()


@pytest.fixture(params=["kombu", "dramatiq"])
def consumer_queue(request: Any, database_url: str) -> Iterator[DelayedQueue]:
    """The queue each adapter consumes with, built with its default options."""
    if request.param == "kombu":
        backend = Backend.acquire(database_url, {})
        yield backend.queue_for("celery")
        backend.release()
    else:
        broker = DelayqBroker(database_url)
        yield broker.queue.with_kind("dramatiq:default")
        broker.close()


def test_consumer_statements_skip_the_flush_and_durable_publishes_wait(
        consumer_queue: DelayedQueue, database_url: str) -> None:
    q = consumer_queue
    check: Callable[[str], str] = lambda statement: _pool_of(database_url, statement)  # noqa: E731
    for i in range(6):
        q.offer(f"k{i}", b"m", durable=True)
        assert check("offer") == "delayq"
    got = q.try_poll_many(6)
    assert len(got) == 6 and check("acquire") == "delayq-relaxed"
    assert q.extend_lease([got[0].lock]) == 6 and check("extend_lease") == "delayq-relaxed"
    assert q.release(got[:1]) == 1 and check("release") == "delayq-relaxed"
    assert dead_letters.dead_letter(q, got[1:2], "dead", 60) == 1
    assert check("dead_letter") == "delayq-relaxed"
    assert q.ack_many(got[2:4]) == 2 and check("ack_many") == "delayq-relaxed"
    assert q.ack(got[4]) == 1 and check("ack") == "delayq-relaxed"
    shown = {p: q.db.run(lambda c: c.execute("SHOW synchronous_commit").fetchone()[0],
                         relaxed=p) for p in (True, False)}
    assert shown == {True: "off", False: "on"}


@pytest.mark.parametrize(("durable", "pool"), [(False, "delayq-relaxed"), (True, "delayq")])
def test_dramatiq_publish_durability_follows_durable_publish(
        database_url: str, durable: bool, pool: str) -> None:
    """Documented: a send commits without the flush wait unless ``durable_publish=True``
    (the kombu transport's is tests/integration/test_kombu_storage_contract.py)."""
    broker = DelayqBroker(database_url, durable_publish=durable)
    try:
        broker.declare_queue("q")
        broker.enqueue(Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))
        assert _pool_of(database_url, "offer") == pool
    finally:
        broker.close()
