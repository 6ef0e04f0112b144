"""DelayedQueue operations against a real PostgreSQL: every outcome of every call.

Most tests inject a :class:`FakeClock` so due-ness and leases are exact; a few use the database
clock to show the default path behaves the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from _workers import FakeClock, wait_until

from delayq_transport import Database, DelayedQueue, Offer, OfferOutcome
from delayq_transport.core.db.queries import Queries
from delayq_transport.core.queue import to_ms
from delayq_transport.formats.celery import kinds_for

CREATED, UPDATED, IGNORED = OfferOutcome.CREATED, OfferOutcome.UPDATED, OfferOutcome.IGNORED
LEASE_S = 30.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cq(database_url: str, clock: FakeClock) -> Iterator[DelayedQueue]:
    """A queue on the injected clock with a 30 s lease."""
    with DelayedQueue(database_url, kind="test", clock=clock, acquire_timeout=LEASE_S) as q:
        yield q


def at(clock: FakeClock, seconds: float) -> datetime:
    return clock() + timedelta(seconds=seconds)


def row_count(q: DelayedQueue) -> int:
    return sum(s.due + s.scheduled + s.in_flight for s in q.status())


# -- offer ------------------------------------------------------------------------------------


def test_offer_creates_updates_and_ignores(cq: DelayedQueue, clock: FakeClock) -> None:
    t = at(clock, 60)
    assert cq.offer("k", b"a", t) is CREATED
    first = cq.get("k")
    assert cq.offer("k", b"a", t) is IGNORED, "same payload and schedule, not in flight"
    assert cq.get("k") == first
    assert cq.offer("k", b"b", t) is UPDATED
    assert cq.get("k").payload == b"b"
    assert cq.offer("k", b"b", at(clock, 90)) is UPDATED, "a new schedule alone is an update"
    stored = cq.get("k")
    assert stored.scheduled_at_ms == stored.scheduled_at_initially_ms == to_ms(at(clock, 90))
    assert stored.id == first.id, "updated in place, no second row"


def test_offer_without_update_leaves_row_alone(cq: DelayedQueue, clock: FakeClock) -> None:
    assert cq.offer("k", b"a", at(clock, 60)) is CREATED
    before = cq.get("k")
    assert cq.offer("k", b"other", at(clock, 5), can_update=False) is IGNORED
    assert cq.get("k") == before


def test_offer_without_time_is_due_now_on_the_queue_clock(
    cq: DelayedQueue, clock: FakeClock
) -> None:
    assert cq.offer("k", b"a") is CREATED
    stored = cq.get("k")
    assert stored.scheduled_at_ms == stored.created_at_ms == to_ms(clock())
    assert cq.try_poll().key == "k"


def test_offer_replaces_an_in_flight_row_and_the_stale_ack_is_a_noop(
    cq: DelayedQueue, clock: FakeClock
) -> None:
    t = clock()
    cq.offer("k", b"a", t)
    held = cq.try_poll()
    assert held is not None and cq.get("k").in_flight
    assert cq.offer("k", b"a", t) is UPDATED, "identical but in flight: replaced, not ignored"
    replaced = cq.get("k")
    assert not replaced.in_flight and replaced.id == held.id
    assert held.ack() is False
    assert cq.contains("k"), "the stale ack must not delete the new message"
    again = cq.try_poll()
    assert again.key == "k" and again.payload == b"a" and not again.is_redelivery
    assert again.ack() is True and not cq.contains("k")


# -- offer_batch -----------------------------------------------------------------------------


def mixed_batch(clock: FakeClock) -> list[Offer]:
    """New keys, repeats inside the batch, and keys that exist before the batch runs."""
    t = at(clock, 60)
    return [
        Offer("n1", b"1", t),
        Offer("e1", b"changed", t),
        Offer("n2", b"2", t),
        Offer("n1", b"1-again", t),
        Offer("e2", b"same", t),
        Offer("n3", b"3", t),
        Offer("n3", b"3", t),
    ]


def seed_existing(q: DelayedQueue, clock: FakeClock) -> None:
    q.offer("e1", b"old", at(clock, 60))
    q.offer("e2", b"same", at(clock, 60))


def test_offer_batch_outcomes_in_input_order(cq: DelayedQueue, clock: FakeClock) -> None:
    seed_existing(cq, clock)
    outcomes = cq.offer_batch(mixed_batch(clock))
    assert outcomes == [CREATED, UPDATED, CREATED, UPDATED, IGNORED, CREATED, IGNORED]
    assert cq.get("n1").payload == b"1-again", "a later repeat replaces the earlier one"
    assert cq.get("e1").payload == b"changed"
    assert cq.count_waiting() == 5


def test_offer_batch_without_update(cq: DelayedQueue, clock: FakeClock) -> None:
    seed_existing(cq, clock)
    outcomes = cq.offer_batch(mixed_batch(clock), can_update=False)
    assert outcomes == [CREATED, IGNORED, CREATED, IGNORED, IGNORED, CREATED, IGNORED]
    assert cq.get("n1").payload == b"1", "the first of repeated keys wins"
    assert cq.get("e1").payload == b"old"


@pytest.mark.parametrize("can_update", [True, False])
def test_offer_batch_chunking_does_not_change_outcomes(
    cq: DelayedQueue, clock: FakeClock, can_update: bool
) -> None:
    """Chunks of 2 split repeats across statements; results must equal one big chunk."""
    small, big = cq.with_kind("small"), cq.with_kind("big")
    batch = mixed_batch(clock) * 2 + [Offer(f"x{i}", b"x", at(clock, i)) for i in range(9)]
    for q in (small, big):
        seed_existing(q, clock)
    by_small = small.offer_batch(batch, can_update, chunk_size=2)
    by_big = big.offer_batch(batch, can_update)
    assert by_small == by_big
    assert by_small.count(CREATED) == 3 + 9
    for key in {o.key for o in batch}:
        assert small.get(key).payload == big.get(key).payload


def test_offer_batch_empty(cq: DelayedQueue) -> None:
    assert cq.offer_batch([]) == []


def test_offer_batch_accepts_plain_tuples(cq: DelayedQueue, clock: FakeClock) -> None:
    assert cq.offer_batch([("a", b"1", clock()), ("b", b"2", None)]) == [CREATED, CREATED]
    assert [e.key for e in cq.try_poll_many(5)] == ["a", "b"]


# -- polling ---------------------------------------------------------------------------------


def test_try_poll_delivers_in_scheduled_order(cq: DelayedQueue, clock: FakeClock) -> None:
    delays = {"d": 4, "a": 1, "c": 3, "b": 2, "e": 5}
    cq.offer_batch([Offer(k, k.encode(), at(clock, s)) for k, s in delays.items()])
    clock.advance(10)
    polled = [cq.try_poll() for _ in delays]
    assert [e.key for e in polled] == sorted(delays, key=delays.get)
    assert [e.scheduled_at for e in polled] == sorted(e.scheduled_at for e in polled)
    assert cq.try_poll() is None


def test_only_due_rows_are_delivered(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer("later", b"x", at(clock, 10))
    assert cq.try_poll() is None
    clock.advance(9.999)
    assert cq.try_poll() is None
    clock.advance(0.001)
    env = cq.try_poll()
    assert env.key == "later" and not env.is_redelivery and env.payload == b"x"


def test_only_due_rows_are_delivered_on_the_database_clock(queue: DelayedQueue) -> None:
    now = queue.now()
    queue.offer("now", b"x", now - timedelta(seconds=1))
    queue.offer("soon", b"y", now + timedelta(seconds=2))
    assert queue.try_poll().key == "now"
    assert queue.try_poll() is None
    env = wait_until(queue.try_poll, what="the row due in 2 s")
    assert env.key == "soon"
    assert queue.now() >= env.scheduled_at


def test_db_clock_is_wall_clock_and_aware(queue: DelayedQueue) -> None:
    before = datetime.now(UTC) - timedelta(milliseconds=1)  # the clock is read in ms
    now = queue.now()
    after = datetime.now(UTC)
    assert now.tzinfo is not None and before <= now <= after  # same host, one clock


def test_try_poll_many_respects_the_limit(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer_batch([Offer(f"k{i}", b"x", at(clock, -i)) for i in range(10)])
    first = cq.try_poll_many(4)
    assert [e.key for e in first] == ["k9", "k8", "k7", "k6"]
    assert len({e.lock for e in first}) == 1, "one lock id per poll"
    assert len(cq.try_poll_many(4)) == 4
    assert [e.key for e in cq.try_poll_many(4)] == ["k1", "k0"]
    assert cq.try_poll_many(4) == [] and cq.try_poll_many(0) == []


def test_kinds_are_drained_in_the_order_given(cq: DelayedQueue, clock: FakeClock) -> None:
    high, low = kinds_for("jobs")[:2]
    cq.with_kind(low).offer_batch([Offer(f"low{i}", b"", at(clock, -10 - i)) for i in range(3)])
    cq.with_kind(high).offer_batch([Offer(f"high{i}", b"", at(clock, -i)) for i in range(2)])
    got = cq.try_poll_many(3, kinds=[high, low])
    assert [(e.kind, e.key) for e in got] == [
        (high, "high1"), (high, "high0"), (low, "low2")
    ], "every due row of the first kind before any of the next, each in time order"
    assert [e.key for e in cq.try_poll_many(5, kinds=[low, high])] == ["low1", "low0"]
    assert cq.try_poll() is None, "this queue's own kind is untouched"


# -- ack ---------------------------------------------------------------------------------------


def test_ack_deletes_exactly_once(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer("k", b"x", clock())
    env = cq.try_poll()
    assert env.ack() is True
    assert env.ack() is False and not cq.contains("k")


def test_old_envelope_cannot_ack_a_reacquired_row(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer("k", b"x", clock())
    old = cq.try_poll()
    clock.advance(LEASE_S + 1)
    new = cq.try_poll()
    assert new.id == old.id and new.is_redelivery and not old.is_redelivery
    assert old.ack() is False and cq.contains("k")
    assert cq.ack_many([old]) == 0 and cq.ack_lock(old.lock) == 0 and cq.contains("k")
    assert new.ack() is True


def test_ack_many_matches_each_id_with_its_own_lock(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer_batch([Offer(f"k{i}", b"x", clock()) for i in range(6)])
    a, b = cq.try_poll_many(3), cq.try_poll_many(3)
    mismatched = (a[0].id, b[0].lock)  # a real id with another poll's lock
    assert cq.ack_many([mismatched]) == 0
    assert cq.ack_many([a[0], a[1], (b[0].id, b[0].lock)]) == 3
    assert cq.ack_many([a[0]]) == 0, "already acked"
    assert cq.ack_many([]) == 0
    assert all(cq.get(e.key).lock == e.lock for e in (a[2], b[1], b[2])), "others still held"


@pytest.mark.parametrize("stale_first", [True, False], ids=["stale-first", "live-first"])
def test_a_batch_holding_both_deliveries_of_one_row_acks_and_releases_by_the_live_lock(
        cq: DelayedQueue, clock: FakeClock, stale_first: bool) -> None:
    """The statements pair a row with its lock by the position of its id, so a batch holding
    one id twice (a row redelivered to the same consumer, both deliveries acked together) is
    split: whichever order the batch has, the live delivery's ack counts and the stale one's
    does not."""
    cq.offer_batch([Offer(f"k{i}", b"x", clock()) for i in range(3)])
    old = cq.try_poll_many(3)
    clock.advance(LEASE_S + 1)
    new = cq.try_poll_many(3)
    assert [e.id for e in new] == [e.id for e in old]
    batch = [old[0], new[0], new[1]] if stale_first else [new[0], old[0], new[1]]
    assert cq.release([old[1], new[2]]) == 1, "only the live lock releases"
    assert cq.get(new[2].key).lock is None
    assert cq.ack_many(batch) == 2
    assert not cq.contains(new[0].key) and not cq.contains(new[1].key)
    assert cq.ack_many([old[2], new[2]]) == 0, "released: no lock matches any more"


def test_ack_lock_spares_rows_reacquired_under_another_lock(
    cq: DelayedQueue, clock: FakeClock
) -> None:
    cq.offer_batch([Offer(f"k{i}", b"x", at(clock, -i)) for i in range(3)])
    first = cq.try_poll_many(3)
    clock.advance(LEASE_S + 1)
    retaken = cq.try_poll_many(1)
    # All three leases ran out at the same instant: which one comes back first is unspecified.
    assert retaken[0].is_redelivery and retaken[0].key in {e.key for e in first}
    assert cq.ack_lock(first[0].lock) == 2
    assert cq.contains(retaken[0].key)
    assert cq.ack_lock(retaken[0].lock) == 1 and row_count(cq) == 0


# -- leases ------------------------------------------------------------------------------------


def test_extend_lease_prevents_redelivery(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer("k", b"x", clock())
    env = cq.try_poll()
    clock.advance(LEASE_S - 2)
    assert cq.extend_lease([env.lock, env.lock]) == 1
    clock.advance(LEASE_S - 2)  # past the first lease, inside the extended one
    assert cq.try_poll() is None
    clock.advance(2)
    again = cq.try_poll()
    assert again.id == env.id and again.is_redelivery


def test_extend_lease_with_explicit_lease_and_unknown_locks(
    cq: DelayedQueue, clock: FakeClock
) -> None:
    cq.offer("k", b"x", clock())
    env = cq.try_poll()
    assert cq.extend_lease([]) == 0 and cq.extend_lease(["no-such-lock"]) == 0
    assert cq.extend_lease([env.lock], lease=timedelta(seconds=300)) == 1
    assert cq.get("k").scheduled_at_ms == to_ms(clock()) + 300_000
    clock.advance(299)
    assert cq.try_poll() is None


def test_lease_expiry_redelivers_flagged(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer("k", b"x", clock())
    env = cq.try_poll()
    assert not env.is_redelivery
    clock.advance(LEASE_S - 0.001)
    assert cq.try_poll() is None
    clock.advance(0.001)
    again = cq.try_poll()
    assert again.is_redelivery and again.payload == b"x" and again.lock != env.lock
    assert again.scheduled_at == env.scheduled_at, "scheduled_at reports the original time"


def test_lease_expiry_on_the_database_clock(database_url: str) -> None:
    with DelayedQueue(database_url, kind="test", acquire_timeout=1.5) as q:
        q.offer("k", b"x")
        env = q.try_poll()
        assert q.try_poll() is None
        again = wait_until(q.try_poll, what="lease expiry")
        assert again.is_redelivery and again.id == env.id
        assert again.scheduled_at_ms >= env.scheduled_at_ms + 1500


def test_release_makes_the_row_due_again_without_a_copy(
    cq: DelayedQueue, clock: FakeClock
) -> None:
    cq.offer_batch([Offer("k", b"x", clock()), Offer("other", b"y", at(clock, 60))])
    env = cq.try_poll()
    assert cq.release([env]) == 1
    assert row_count(cq) == 2 and cq.count_waiting() == 2
    # Released at its own due time: it comes back 1 ms later so it reads as a redelivery.
    clock.advance(0.001)
    again = cq.try_poll()
    assert again.id == env.id and again.is_redelivery and again.payload == b"x"
    assert cq.release([env]) == 0, "the old delivery no longer holds the row"
    assert again.ack() is True and row_count(cq) == 1


def test_release_with_delay(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer("k", b"x", clock())
    env = cq.try_poll()
    assert cq.release([(env.id, env.lock)], delay=5) == 1
    clock.advance(4.999)
    assert cq.try_poll() is None
    clock.advance(0.001)
    assert cq.try_poll().is_redelivery
    assert cq.release([]) == 0


# -- inspection and maintenance ----------------------------------------------------------------


def test_get_contains_delete(cq: DelayedQueue, clock: FakeClock) -> None:
    t = at(clock, 60)
    cq.offer("k", b"x", t)
    cq.with_kind("other").offer("k", b"other-kind", t)
    stored = cq.get("k")
    assert (stored.key, stored.kind, stored.payload, stored.lock) == ("k", "test", b"x", None)
    assert stored.scheduled_at == t and stored.created_at_ms == to_ms(clock())
    assert cq.contains("k") and not cq.contains("missing") and cq.get("missing") is None
    assert cq.delete("k") is True and cq.delete("k") is False
    assert not cq.contains("k")
    assert cq.with_kind("other").get("k").payload == b"other-kind", "kinds are partitions"


def test_delete_waiting_skips_in_flight_rows(cq: DelayedQueue, clock: FakeClock) -> None:
    other = cq.with_kind("other")
    cq.offer_batch([Offer("k1", b"", at(clock, 60)), Offer("busy", b"", clock())])
    other.offer("k1", b"", at(clock, 60))
    held = cq.try_poll()
    assert held.key == "busy"
    deleted = cq.delete_waiting(["k1", "busy", "missing"])
    assert sorted(deleted) == [("k1", "other"), ("k1", "test")]
    assert cq.contains("busy") and held.ack() is True
    assert cq.delete_waiting([]) == []


def test_purge_keeps_in_flight_rows(cq: DelayedQueue, clock: FakeClock) -> None:
    other = cq.with_kind("other")
    other.offer("o", b"", clock())
    cq.offer_batch([Offer(f"k{i}", b"", at(clock, i - 1)) for i in range(4)])
    held = cq.try_poll()
    assert cq.purge() == 3
    assert cq.count_waiting() == 0 and cq.contains(held.key)
    assert held.ack() is True
    assert other.count_waiting() == 1, "purge touches only the kinds given"
    assert cq.purge(kinds=["other"]) == 1 and other.count_waiting() == 0


def test_count_waiting_excludes_in_flight(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer_batch([Offer(f"k{i}", b"", at(clock, i - 2)) for i in range(5)])
    cq.with_kind("b").offer("x", b"", clock())
    assert cq.count_waiting() == 5
    cq.try_poll_many(2)
    assert cq.count_waiting() == 3
    assert cq.count_waiting(kinds=["test", "b"]) == 4
    assert cq.count_waiting(kinds=["nothing"]) == 0


def test_next_due_includes_leases(cq: DelayedQueue, clock: FakeClock) -> None:
    assert cq.next_due() is None
    cq.offer("k", b"", clock())
    cq.with_kind("b").offer("x", b"", at(clock, 10))
    assert cq.next_due() == clock()
    cq.try_poll()
    assert cq.next_due() == at(clock, LEASE_S), "the lease end is when the row can come back"
    assert cq.next_due(kinds=["test", "b"]) == at(clock, 10)


def test_status_counters(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer_batch([Offer("a", b"", at(clock, -5)), Offer("b", b"", at(clock, -1)),
                    Offer("c", b"", at(clock, 10)), Offer("e", b"", at(clock, 20))])
    cq.with_kind("other").offer("o", b"", at(clock, 5))
    assert cq.try_poll().key == "a"
    other, test = cq.status()  # ordered by kind
    assert (test.kind, test.due, test.scheduled, test.in_flight, test.redelivered) == (
        "test", 1, 2, 1, 0)
    assert test.oldest_due_lag_ms == 1000 and test.next_due_at == at(clock, 10)
    assert (other.kind, other.scheduled, other.next_due_at) == ("other", 1, at(clock, 5))
    clock.advance(LEASE_S + 1)  # every row due, "a"'s lease lapsed
    test = cq.status()[1]
    assert (test.due, test.scheduled, test.in_flight, test.redelivered) == (4, 0, 0, 1)
    assert test.oldest_due_lag_ms == (LEASE_S + 2) * 1000 and test.next_due_at is None


def test_status_counts_released_rows_as_redelivered(cq: DelayedQueue, clock: FakeClock) -> None:
    cq.offer("k", b"", clock())
    cq.release([cq.try_poll()], delay=5)
    status = cq.status()[0]
    assert (status.due, status.scheduled, status.in_flight, status.redelivered) == (0, 1, 0, 1)


def test_status_of_an_empty_table(queue: DelayedQueue) -> None:
    assert queue.status() == []


# -- ownership of the pool ------------------------------------------------------------------


def test_a_queue_closes_a_handed_over_database_and_leaves_a_shared_one_open(
        database_url: str) -> None:
    """``owns_database=True`` (the CLI's and beat's pool made for one queue) is closed with
    the queue and not by its ``with_kind`` clones; a shared Database stays open."""
    shared, handed = Database(database_url, min_size=0), Database(database_url, min_size=0)
    try:
        with DelayedQueue(shared, kind="test"):
            pass
        assert not shared.closed
        queue = DelayedQueue(handed, kind="test", owns_database=True)
        queue.with_kind("other").close()
        assert not handed.closed, "a clone shares the pool, it does not own it"
        queue.close()
        assert handed.closed
    finally:
        shared.close()
        handed.close()


def test_a_due_time_between_two_milliseconds_is_never_taken_early(
        cq: DelayedQueue, clock: FakeClock) -> None:
    """An eta of 10.0006 s is stored as 10.001 s, not 10.000 s: at 10.0009 s (the clock's
    millisecond 10.000) the row is not due yet; at 10.001 s it is (issue 41: none early).
    Celery's etas carry microseconds; the table keeps milliseconds."""
    t0 = clock()
    assert cq.offer("k", b"a", t0 + timedelta(microseconds=10_000_600)) is CREATED
    clock.advance(timedelta(microseconds=10_000_900))
    assert cq.poll(10)[0] == []
    clock.advance(timedelta(microseconds=100))
    assert [e.key for e in cq.poll(10)[0]] == ["k"]


def test_the_database_clock_never_runs_ahead_of_now(database_url: str) -> None:
    """``{now}`` rounds down to the millisecond: a poll can take a row due at T only once the
    database's now() reached T, never half a millisecond before (issue 41: none early)."""
    q = Queries("delayed_queue")
    with psycopg.connect(database_url) as conn:
        for _ in range(200):  # now() is the transaction's: both read the same instant
            row = conn.execute(q["db_now"], {"now": None}).fetchone()
            exact = conn.execute("SELECT extract(epoch FROM now()) * 1000").fetchone()
            assert row is not None and exact is not None
            assert row[0] <= exact[0] < row[0] + 1, (row[0], exact[0])
            conn.rollback()
