"""The LISTEN side of wake-ups (core/queue/listen.py): ``drain`` reads libpq's notifications itself,
so nothing psycopg took aside, nothing sent, and no broken connection may go unnoticed."""

from __future__ import annotations

import select
import time

import psycopg
import pytest
from _workers import WAIT_S

from delayq_transport import DelayedQueue
from delayq_transport.core import DatabaseUnavailable
from delayq_transport.core.queue import Listener


def _drain_until(listener: Listener, count: int) -> list[tuple[str, int]]:
    """Every notification until ``count`` arrived (bounded wait on the socket, no sleeps)."""
    got: list[tuple[str, int]] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        select.select([listener.fd], [], [], max(0.0, deadline - time.monotonic()))
        got += listener.drain()
    return got


def test_drain_returns_every_notification_once_in_order(queue: DelayedQueue,
                                                        database_url: str) -> None:
    listener = Listener(queue.db, queue.queries)
    try:
        channel = queue.queries["listen"].split(None, 1)[1]
        sent = [(f"celery\x06\x16{i % 3}" if i % 2 else "q:with:colons", 1_000 + i)
                for i in range(200)]
        with psycopg.connect(database_url, autocommit=True) as conn:
            for kind, at in sent:
                conn.execute(f"NOTIFY {channel}, '{kind}:{at}'")
        got = _drain_until(listener, len(sent))
        assert got == sent
        assert listener.drain() == []
    finally:
        listener.close()


def test_a_notification_that_came_with_the_listen_reply_is_not_lost(
        queue: DelayedQueue) -> None:
    """psycopg keeps what arrives during a statement of its own in a backlog libpq no longer
    holds; the listener hands it out with its first drain."""

    class SelfNotifying:
        def __getitem__(self, name: str) -> str:
            listen = queue.queries[name]
            if name != "listen":
                return listen
            channel = listen.split(None, 1)[1]
            return f"{listen}; NOTIFY {channel}, 'early:7'"

    listener = Listener(queue.db, SelfNotifying())  # type: ignore[arg-type]
    try:
        assert listener.drain() == [("early", 7)]
        assert listener.drain() == []
    finally:
        listener.close()


def test_a_killed_listen_connection_raises_database_unavailable(queue: DelayedQueue,
                                                                database_url: str) -> None:
    listener = Listener(queue.db, queue.queries)
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' "
                               "AND datname = current_database()").fetchone()
            assert row is not None
            conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        deadline = time.monotonic() + WAIT_S
        with pytest.raises(DatabaseUnavailable, match="LISTEN connection lost"):
            while time.monotonic() < deadline:
                select.select([listener.fd], [], [], max(0.0, deadline - time.monotonic()))
                listener.drain()
    finally:
        listener.close()
