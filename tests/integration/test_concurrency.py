"""Many threads and processes on one queue: CAS offers of one key, producers/consumers with
exact delivery counts, and a consumer killed while it holds messages."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _workers import MP, WAIT_S, consume, hold_and_hang, offer_same_key, produce, wait_until

from delayq_transport import DelayedQueue, Offer

CAS_ROUNDS = 25


def join_all(procs: list[Any], timeout_s: float = 90) -> None:
    for p in procs:
        p.join(timeout_s)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.exitcode is None:
            p.kill()
    assert codes == [0] * len(procs), f"worker exit codes {codes}"


def check_cas_result(database_url: str, key: str, results: dict[int, list[str]]) -> None:
    """Exactly one Created overall, every other offer Updated, and the row holds the last
    offer of one of the workers (a worker's later offer always overwrites its earlier one)."""
    counts = Counter(o for outcomes in results.values() for o in outcomes)
    assert counts == {"created": 1, "updated": len(results) * CAS_ROUNDS - 1}, counts
    with DelayedQueue(database_url, kind="cas", ensure_schema=False) as q:
        stored = q.get(key)
        assert q.count_waiting() == 1
    finals = {f"w{w}-r{CAS_ROUNDS - 1}".encode() for w in results}
    assert stored.payload in finals, stored.payload
    round_ = CAS_ROUNDS - 1
    assert stored.scheduled_at == datetime(2031, 1, 1, tzinfo=UTC) + timedelta(seconds=round_)


def test_concurrent_offers_of_one_key_from_threads(database_url: str) -> None:
    workers = 6
    barrier = threading.Barrier(workers)
    results: dict[int, list[str]] = {}
    at = datetime(2031, 1, 1, tzinfo=UTC)

    with DelayedQueue(database_url, kind="cas", pool_max_size=workers) as q:

        def offer_rounds(worker: int) -> None:
            barrier.wait()
            results[worker] = [
                q.offer("hot", f"w{worker}-r{i}".encode(), at + timedelta(seconds=i)).value
                for i in range(CAS_ROUNDS)
            ]

        threads = [threading.Thread(target=offer_rounds, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
    assert len(results) == workers, "a thread raised (see captured stderr)"
    check_cas_result(database_url, "hot", results)


def test_offers_of_one_key_racing_a_consumer(database_url: str) -> None:
    """Rows vanish under the offers (acked), which sends offer back to its insert: every row
    ever created is either acked exactly once or still there, and no offer is lost or fails."""
    writers, offers_done = 4, threading.Event()
    outcomes: list[str] = []
    acked: list[bytes] = []
    with DelayedQueue(database_url, kind="cas", pool_max_size=writers + 1) as q:

        def offer_rounds(worker: int) -> None:
            for i in range(CAS_ROUNDS):
                outcomes.append(q.offer("hot", f"w{worker}-r{i}".encode()).value)

        def consume() -> None:
            while not offers_done.is_set() or q.count_waiting():
                acked.extend(e.payload for e in q.try_poll_many(1) if e.ack())

        threads = [threading.Thread(target=offer_rounds, args=(w,)) for w in range(writers)]
        consumer = threading.Thread(target=consume)
        for t in [*threads, consumer]:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        offers_done.set()
        consumer.join(WAIT_S)
        assert not consumer.is_alive() and q.status() == []
    assert len(outcomes) == writers * CAS_ROUNDS and "ignored" not in outcomes
    assert outcomes.count("created") == len(acked), "each created row acked exactly once"
    assert len(set(acked)) == len(acked)


@pytest.mark.slow
def test_concurrent_offers_of_one_key_from_processes(database_url: str) -> None:
    workers = 4
    barrier, out = MP.Barrier(workers), MP.Queue()
    procs = [
        MP.Process(
            target=offer_same_key, args=(database_url, "hot", w, CAS_ROUNDS, barrier, out)
        )
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    join_all(procs)
    check_cas_result(database_url, "hot", results)


@pytest.mark.slow
def test_producers_and_consumers_deliver_each_message_exactly_once(database_url: str) -> None:
    producers, consumers, per_producer = 3, 3, 7_000
    start = MP.Barrier(producers + consumers)
    done, out = MP.Event(), MP.Queue()
    prods = [MP.Process(target=produce, args=(database_url, "load", w, per_producer, start))
             for w in range(producers)]
    cons = [MP.Process(target=consume, args=(database_url, "load", start, done, out))
            for _ in range(consumers)]
    for p in prods + cons:
        p.start()
    join_all(prods)
    done.set()
    reports = [out.get(timeout=90) for _ in cons]
    join_all(cons)

    delivered = Counter(key for _, keys, _, _ in reports for key in keys)
    expected = {f"p{w}-{i}" for w in range(producers) for i in range(per_producer)}
    assert len(expected) == 21_000
    assert set(delivered) == expected, "lost or unexpected messages"
    assert max(delivered.values()) == 1, "a message was delivered twice"
    assert sum(acked for _, _, acked, _ in reports) == 21_000, "every ack deleted its row"
    assert sum(r for _, _, _, r in reports) == 0, "no lease ran out, so no redelivery"
    assert all(keys for _, keys, _, _ in reports), "every consumer got a share"
    with DelayedQueue(database_url, kind="load", ensure_schema=False) as q:
        assert q.status() == []


@pytest.mark.slow
def test_killed_consumer_messages_come_back_after_the_lease(database_url: str) -> None:
    lease_s, long_lease_s = 3.0, 60.0
    with DelayedQueue(database_url, kind="kill", acquire_timeout=long_lease_s) as q:
        q.offer_batch([Offer(f"m{i}", b"x") for i in range(50)])
        out = MP.Queue()
        child = MP.Process(target=hold_and_hang, args=(database_url, "kill", lease_s, out))
        child.start()
        acquired_ms, held = out.get(timeout=WAIT_S)
        assert held == sorted(f"m{i}" for i in range(50))
        assert q.try_poll_many(100) == [], "held by a live consumer"

        os.kill(child.pid, signal.SIGKILL)
        child.join(WAIT_S)
        assert child.exitcode == -signal.SIGKILL
        lease_end_ms = acquired_ms + int(lease_s * 1000)

        # Polled from the kill on: nothing comes back while the dead consumer's lease lasts.
        back = wait_until(lambda: q.try_poll_many(100), what="redelivery after the lease")
        assert sorted(e.key for e in back) == held
        assert all(e.is_redelivery for e in back)
        for env in back:
            # The new lease starts at the database time of the redelivering poll: not before
            # the dead consumer's lease ended.
            polled_at_ms = q.get(env.key).scheduled_at_ms - int(long_lease_s * 1000)
            assert polled_at_ms >= env.scheduled_at_ms >= lease_end_ms
        assert q.ack_many(back) == 50 and q.status() == []

