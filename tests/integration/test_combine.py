"""Concurrent offers of one process share one INSERT and one COMMIT (core/queue/combine.py), and
each caller returns only after the commit that holds its row."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from delayq_transport import DelayedQueue
from delayq_transport.core import DatabaseError, InvalidInput
from delayq_transport.core.queue import OfferOutcome
from delayq_transport.core.queue.combine import OfferCombiner


class Writes:
    """Counts the combiner's real writes (they still go to PostgreSQL): lone inserts and the
    sizes of multi-row ones."""

    def __init__(self, combiner: OfferCombiner) -> None:
        self.ones = 0
        self.batches: list[int] = []
        one, many = combiner.write_one, combiner.write_many

        def write_one(params: dict[str, Any]) -> int | None:
            self.ones += 1
            return one(params)

        def write_many(chunk: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
            self.batches.append(len(chunk))
            return many(chunk)

        combiner.write_one, combiner.write_many = write_one, write_many


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_threads_share_commits_and_return_after_theirs(database_url: str) -> None:
    """16 threads x 150 offers: every row stored once, each call returns CREATED only once its
    row is visible to another connection, and offers that met a write in flight were written
    together (fewer writes than offers)."""
    threads, per_thread = 16, 150
    with DelayedQueue(database_url, kind="c", pool_max_size=16) as q:
        writes = Writes(q._combiners[False])
        invisible: list[str] = []

        def publish(t: int) -> None:
            with psycopg.connect(database_url, autocommit=True) as other:
                for i in range(per_thread):
                    key = f"{t}-{i}"
                    assert q.offer(key, b"x", durable=False) is OfferOutcome.CREATED
                    row = other.execute('SELECT 1 FROM delayed_queue WHERE "pKey" = %s',
                                        (key,)).fetchone()
                    if row is None:
                        invisible.append(key)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(publish, range(threads)))
        assert invisible == [], "a call returned before its row was committed"
        with psycopg.connect(database_url) as conn:
            rows, keys = conn.execute('SELECT count(*), count(DISTINCT "pKey") FROM '
                                      'delayed_queue WHERE "pKind" = %s', ("c",)).fetchone()
        total = threads * per_thread
        assert (rows, keys) == (total, total)
        assert writes.ones + sum(writes.batches) == total
        assert writes.batches and max(writes.batches) > 1, "no offers were combined"
        assert writes.ones + len(writes.batches) < total


def test_a_lone_offer_writes_at_once(queue: DelayedQueue) -> None:
    """Nothing else publishing: the first caller writes its own row, no batch, no wait."""
    writes = Writes(queue._combiners[True])
    assert queue.offer("alone", b"x") is OfferOutcome.CREATED
    assert (writes.ones, writes.batches) == (1, [])
    assert queue.offer("alone", b"x", can_update=False) is OfferOutcome.IGNORED
    assert queue.offer("alone", b"y") is OfferOutcome.UPDATED, "an existing key is replaced"
    assert queue.get("alone").payload == b"y"


def test_a_bad_row_fails_only_its_own_call(database_url: str) -> None:
    """A batch refused by the database as a whole (here a DBA's CHECK constraint) is written
    again row by row: only the offending call fails, with the database's reason."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute('ALTER TABLE delayed_queue ADD CONSTRAINT no_poison '
                      'CHECK ("pKey" <> \'poison\')')
        with DelayedQueue(database_url, kind="c", pool_max_size=8) as q, \
                psycopg.connect(database_url) as blocker:
            combiner = q._combiners[True]
            writes = Writes(combiner)
            # Hold the first write in flight: its key is being inserted by an open transaction.
            blocker.execute("INSERT INTO delayed_queue (\"pKey\", \"pKind\", payload, "
                            "\"scheduledAt\", \"scheduledAtInitially\", \"createdAt\") "
                            "VALUES ('first', 'c', '', 0, 0, 0)")
            with ThreadPoolExecutor(5) as pool:
                first = pool.submit(q.offer, "first", b"x", can_update=False)
                wait_until(lambda: combiner._busy, "the first write to be in flight")
                others = {key: pool.submit(q.offer, key, b"x")
                          for key in ("good-1", "poison", "good-2", "good-3")}
                wait_until(lambda: len(combiner._pending) == 4, "four offers to gather")
                blocker.rollback()
                assert first.result(timeout=10) is OfferOutcome.CREATED
                for key in ("good-1", "good-2", "good-3"):
                    assert others[key].result(timeout=10) is OfferOutcome.CREATED
                with pytest.raises(DatabaseError, match="no_poison"):
                    others["poison"].result(timeout=10)
            assert writes.batches == [4], "the four gathered offers went as one batch first"
            assert q.get("poison") is None and q.get("good-2") is not None


def test_bad_input_is_refused_before_any_write(queue: DelayedQueue) -> None:
    writes = Writes(queue._combiners[True])
    with pytest.raises(InvalidInput, match="not valid Unicode"):
        queue.offer("lone-\ud800", b"x")
    assert (writes.ones, writes.batches) == (0, [])


def test_durabilities_do_not_mix(database_url: str) -> None:
    """A durable offer never rides in a relaxed commit: one combiner per durability."""
    with DelayedQueue(database_url, kind="c") as q:
        durable, relaxed = Writes(q._combiners[True]), Writes(q._combiners[False])
        barrier = threading.Barrier(8)

        def publish(i: int) -> None:
            barrier.wait()
            q.offer(f"k{i}", b"", durable=i % 2 == 0)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(publish, range(8)))
        assert durable.ones + sum(durable.batches) == 4
        assert relaxed.ones + sum(relaxed.batches) == 4
