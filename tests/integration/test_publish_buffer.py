"""``PublishBuffer`` (``publish_linger``): offers written in batches by a thread, none lost.

Against the real database: what is written, in how many transactions (rows of one statement
share its ``xmin``), what a failing write keeps, what a full buffer refuses, and that a forked
child never writes its parent's buffer a second time.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import kombu
import psycopg
import pytest

from delayq_transport import DatabaseUnavailable, DelayedQueue, InvalidInput
from delayq_transport.core.queue import PublishBuffer, check_linger, publish_buffer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def dq(database_url: str) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind="buf") as q:
        yield q


def rows(url: str) -> list[tuple[str, str, int, int]]:
    """(kind, key, id, xmin) of every row, in id order."""
    with psycopg.connect(url, autocommit=True) as conn:
        return [(r[0], r[1], r[2], int(r[3])) for r in conn.execute(
            'SELECT "pKind", "pKey", "id", xmin::text::bigint FROM delayed_queue ORDER BY id')]


def wait_for_rows(url: str, n: int, timeout: float = 10.0) -> list[tuple[str, str, int, int]]:
    deadline = time.monotonic() + timeout
    while True:
        found = rows(url)
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def rename_table(url: str, old: str, new: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{old}" RENAME TO "{new}"')


@contextmanager
def table_away(url: str) -> Iterator[None]:
    """Every write fails while the table is renamed (a real error from the server)."""
    rename_table(url, "delayed_queue", "delayed_queue_away")
    try:
        yield
    finally:
        rename_table(url, "delayed_queue_away", "delayed_queue")


def keys_once_closed(buffer: PublishBuffer, url: str) -> list[str]:
    """Flush (it must succeed now), close, and read back every stored key."""
    try:
        assert buffer.flush(timeout=20)
    finally:
        buffer.close()
    return sorted(k for _, k, _, _ in rows(url))


def test_offers_are_written_after_the_linger_in_few_statements_in_put_order(
        dq: DelayedQueue, database_url: str) -> None:
    buffer = PublishBuffer(dq.with_kind, 0.05)
    try:
        later = datetime.now(UTC) + timedelta(hours=1)
        for i in range(300):
            buffer.put("a" if i % 3 else "b", f"k{i}", b"x" * 50, later if i == 7 else None)
        assert len(rows(database_url)) < 300  # put returned before its row was written
        found = wait_for_rows(database_url, 300)  # no flush: the linger alone writes them
    finally:
        buffer.close()
    assert sorted(k for _, k, _, _ in found) == sorted(f"k{i}" for i in range(300))
    for kind in ("a", "b"):  # within a kind, ids follow the order of put
        keys = [int(k[1:]) for kd, k, _, _ in found if kd == kind]
        assert keys == sorted(keys)
    assert len({x for _, _, _, x in found}) <= 20  # a handful of transactions, not 300
    assert buffer.pending == 0
    row = dq.with_kind("a").get("k7")
    assert row is not None and abs(row.scheduled_at - later) < timedelta(milliseconds=1)


def test_flush_writes_at_once_and_waits(dq: DelayedQueue, database_url: str) -> None:
    buffer = PublishBuffer(dq.with_kind, 1.0)
    buffer.linger = 3600.0  # longer than the wait below: only flush() can explain a write
    try:
        for i in range(10):
            buffer.put("buf", f"f{i}", b"p")
        assert buffer.flush(timeout=30)  # bounded: the linger would take an hour
        assert len(rows(database_url)) == 10 and buffer.pending == 0
    finally:
        buffer.close()


def test_bad_input_raises_in_the_caller_and_buffers_nothing(dq: DelayedQueue) -> None:
    buffer = PublishBuffer(dq.with_kind, 0.01)
    try:
        with pytest.raises(InvalidInput, match="key must be a non-empty str"):
            buffer.put("buf", "", b"p")
        with pytest.raises(InvalidInput, match="payload must be bytes"):
            buffer.put("buf", "k", "text")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="kind is 101 characters"):
            buffer.put("k" * 101, "k", b"p")
        assert buffer.pending == 0
    finally:
        buffer.close()
    for bad in (-0.1, 1.5, "soon", None):
        with pytest.raises(InvalidInput, match="publish_linger must be"):
            check_linger(bad)


def test_a_failing_write_keeps_every_offer_and_writes_them_once_it_works(
        dq: DelayedQueue, database_url: str) -> None:
    buffer = PublishBuffer(dq.with_kind, 0.01)
    with table_away(database_url):
        for i in range(50):
            buffer.put("buf", f"r{i}", b"p")
        assert not buffer.flush(timeout=0.5)  # the table is gone: nothing can be written
        assert buffer.pending == 50
    # each once, none lost
    assert keys_once_closed(buffer, database_url) == sorted(f"r{i}" for i in range(50))


def test_a_full_buffer_blocks_then_names_the_problem(
        dq: DelayedQueue, database_url: str) -> None:
    buffer = PublishBuffer(dq.with_kind, 0.01, max_batch=1, max_pending=5, put_timeout=0.3)
    with table_away(database_url):
        for i in range(5):
            buffer.put("buf", f"m{i}", b"p")
        with pytest.raises(DatabaseUnavailable, match="5 buffered publishes are waiting"):
            buffer.put("buf", "m5", b"p")
    assert keys_once_closed(buffer, database_url) == [f"m{i}" for i in range(5)]


def test_a_forked_child_never_writes_its_parents_buffer(
        dq: DelayedQueue, database_url: str) -> None:
    buffer = PublishBuffer(dq.with_kind, 1.0)
    try:
        for i in range(20):
            buffer.put("buf", f"c{i}", b"p")
        pid = os.fork()
        if pid == 0:  # the child: what its interpreter exit would do, then leave at once
            code = 1
            try:
                publish_buffer._flush_at_exit()
                code = 0 if buffer.pending == 0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert rows(database_url) == []  # the child wrote nothing of the parent's
    finally:
        buffer.close()  # the parent writes them, once
    assert sorted(k for _, k, _, _ in rows(database_url)) == sorted(f"c{i}" for i in range(20))


def _publish_and_return(url: str, n: int) -> None:
    """A multiprocessing child's body: buffer ``n`` offers (nothing flushes them) and end."""
    queue = DelayedQueue(url, kind="child")
    buffer = PublishBuffer(queue.with_kind, 1.0)
    for i in range(n):
        buffer.put("child", f"p{i}", b"p")


def test_a_multiprocessing_child_writes_its_buffer_when_it_ends(database_url: str) -> None:
    """multiprocessing and billiard (Celery's prefork pool) children end with ``os._exit``,
    skipping ``atexit``: the buffer is written by their exit hook instead."""
    child = multiprocessing.get_context("fork").Process(target=_publish_and_return,
                                                        args=(database_url, 30))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert sorted(k for _, k, _, _ in rows(database_url)) == sorted(f"p{i}" for i in range(30))


def test_kombu_publish_linger_delivers_each_message_once_and_counts_see_the_buffer(
        database_url: str) -> None:
    import delayq_transport  # noqa: F401  (registers the scheme)

    options = {"publish_linger": 0.05, "polling_interval": 0.5, "acquire_timeout": 30}
    with kombu.Connection("delayq+" + database_url, transport_options=options) as conn:
        queue = conn.SimpleQueue("lingered")
        try:
            for i in range(200):
                queue.put({"n": i})
            assert queue.qsize() == 200  # a count writes this process' buffer first
            got = [queue.get(timeout=10) for _ in range(200)]
            for message in got:
                message.ack()
        finally:
            queue.close()
    assert sorted(m.payload["n"] for m in got) == list(range(200))
    with pytest.raises(InvalidInput, match="publish_linger returns before it is written"):
        kombu.Connection("delayq+" + database_url, transport_options={
            "publish_linger": 0.01, "durable_publish": True}).connect()
