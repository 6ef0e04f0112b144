"""The consumer's low watermark (core/queue/watermark.py): the poll starts above the rows it already
took, and every way a live due row can end up below that floor brings it back: a NOTIFY, this
process's own writes, the probe below the floor (in its own thread), a reset, a clock stepped
back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from _workers import WAIT_S

from delayq_transport import DelayedQueue, Envelope
from delayq_transport.core.db.queries import Queries
from delayq_transport.core.queue.watermark import LowWatermarks, next_search_interval

RESCAN_S = 3600.0


class Ticker:
    """An injected monotonic clock for the rescan interval (no sleeps)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def ticker() -> Ticker:
    return Ticker()


@pytest.fixture
def wq(database_url: str, ticker: Ticker) -> Iterator[DelayedQueue]:
    """A consumer with a watermark whose probe only runs when the test advances time."""
    with DelayedQueue(database_url, kind="test", low_watermark=True) as q:
        assert q.watermarks is not None
        q.watermarks = LowWatermarks(q._probe_below, RESCAN_S, monotonic=ticker)
        yield q


def no_probe(kinds: list[str], starts: list[int | None], floors: list[int]
             ) -> list[tuple[str, int]]:
    return []


def probe_then_poll(q: DelayedQueue, ticker: Ticker) -> Envelope | None:
    """Past the interval: the next poll launches the probe but does not wait for it (it still
    starts at the floor); once the probe has lowered the floor, the poll after takes the row."""
    assert q.watermarks is not None
    ticker.t += RESCAN_S
    run = q.watermarks.probes_run
    assert q.try_poll() is None, "the probe is off the poll path"
    assert q.watermarks.wait_probes(WAIT_S), "probe still running"
    assert q.watermarks.probes_run == run + 1
    return q.try_poll()


@pytest.fixture
def other(database_url: str) -> Iterator[DelayedQueue]:
    """Another process's queue on the same table (no watermark)."""
    with DelayedQueue(database_url, kind="test") as q:
        yield q


def floor(q: DelayedQueue) -> int | None:
    assert q.watermarks is not None
    return q.watermarks.low("test")


def test_floor_after_a_full_batch_is_the_last_row_taken(wq: DelayedQueue,
                                                        other: DelayedQueue) -> None:
    now = other.now()
    for i, s in enumerate((30, 20, 10)):
        other.offer(f"k{i}", b"", now - timedelta(seconds=s))
    first = wq.try_poll_many(2)
    assert [e.key for e in first] == ["k0", "k1"]
    assert floor(wq) == int((now - timedelta(seconds=20)).timestamp() * 1000)
    assert [e.key for e in wq.try_poll_many(2)] == ["k2"]
    low = floor(wq)
    assert low is not None and low >= int(now.timestamp() * 1000), "drained: floor = poll's now"


def test_a_row_below_the_floor_waits_for_a_notify(database_url: str, wq: DelayedQueue,
                                                  other: DelayedQueue) -> None:
    """Another process offers a row due in the past (an ETA already passed): the floor hides
    it until the insert trigger's NOTIFY payload lowers the floor, as the transport does."""
    assert wq.try_poll() is None  # floor = now
    listen = psycopg.connect(database_url, autocommit=True)
    listen.execute(Queries("delayed_queue")["listen"])
    other.offer("late", b"", other.now() - timedelta(seconds=60))
    assert wq.try_poll() is None, "the floor is in effect"
    note = next(listen.notifies(timeout=WAIT_S))
    listen.close()
    kind, _, at = note.payload.rpartition(":")
    wq.lower_watermark(kind, int(at))
    got = wq.try_poll()
    assert got is not None and got.key == "late"


def test_the_probe_finds_what_no_one_announced(wq: DelayedQueue, other: DelayedQueue,
                                               ticker: Ticker) -> None:
    assert wq.try_poll() is None
    other.offer("late", b"", other.now() - timedelta(seconds=60))
    assert wq.try_poll() is None
    got = probe_then_poll(wq, ticker)
    assert got is not None and got.key == "late"
    assert wq.watermarks is not None and wq.watermarks.probes_found == 1


def test_the_probe_runs_once_per_interval_and_finds_nothing_when_nothing_is_below(
        wq: DelayedQueue, other: DelayedQueue, ticker: Ticker) -> None:
    assert wq.try_poll() is None
    at = other.now() - timedelta(seconds=1)
    other.offer("due", b"", at)
    wq.lower_watermark("test", int(at.timestamp() * 1000))  # what its NOTIFY says
    ticker.t += RESCAN_S
    got = wq.try_poll()  # launches the probe, takes the row from the lowered floor
    assert got is not None and got.key == "due"
    assert wq.watermarks is not None and wq.watermarks.wait_probes(WAIT_S)
    assert (wq.watermarks.probes_run, wq.watermarks.probes_found) == (1, 0)
    for _ in range(3):
        assert wq.try_poll() is None
    assert wq.watermarks.wait_probes(WAIT_S) and wq.watermarks.probes_run == 1


def test_a_failed_probe_is_retried_one_interval_later(ticker: Ticker) -> None:
    calls: list[list[int]] = []

    def failing(kinds: list[str], starts: list[int | None], floors: list[int]
                ) -> list[tuple[str, int]]:
        calls.append(floors)
        raise RuntimeError("statement timeout")

    marks = LowWatermarks(failing, RESCAN_S, monotonic=ticker)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000)
    ticker.t += RESCAN_S
    marks.finish(marks.begin(["k"]), {}, 10, 0, 6_000)
    assert marks.wait_probes(WAIT_S) and calls == [[6_000]]
    assert marks.low("k") == 6_000, "a failed probe lowers nothing"
    marks.finish(marks.begin(["k"]), {}, 10, 0, 7_000)
    assert marks.wait_probes(WAIT_S) and len(calls) == 1, "not before the interval"
    ticker.t += RESCAN_S
    marks.finish(marks.begin(["k"]), {}, 10, 0, 8_000)
    assert marks.wait_probes(WAIT_S) and len(calls) == 2


def test_own_offers_lower_the_floor(wq: DelayedQueue) -> None:
    assert wq.try_poll() is None
    wq.offer("past", b"", wq.now() - timedelta(seconds=60))
    got = wq.try_poll()
    assert got is not None and got.key == "past"
    assert wq.try_poll() is None
    wq.offer_batch([("b1", b"", wq.now() - timedelta(seconds=90))])
    got = wq.try_poll()
    assert got is not None and got.key == "b1"


@pytest.mark.parametrize("locker", ["poll", "ack"])
def test_rows_a_rolled_back_locker_kept_come_back_by_rescan(
    database_url: str, wq: DelayedQueue, other: DelayedQueue, ticker: Ticker, locker: str
) -> None:
    """The poll skips a row another transaction locked (a concurrent poll, or an ack of an
    expired lease) and moves its floor above it; that transaction rolls back, silently. The
    periodic probe below the floor is what finds the row again."""
    other.offer("r", b"", other.now() - timedelta(seconds=60))
    with psycopg.connect(database_url) as conn:
        if locker == "poll":
            conn.execute('SELECT 1 FROM delayed_queue WHERE "pKey" = %s FOR UPDATE', ["r"])
        else:
            conn.execute('DELETE FROM delayed_queue WHERE "pKey" = %s', ["r"])
        assert wq.try_poll() is None  # skipped (locked); nothing else due: floor = now
        conn.rollback()
    assert wq.try_poll() is None, "below the floor"
    got = probe_then_poll(wq, ticker)
    assert got is not None and got.key == "r"


def test_reset_scans_from_the_bottom(wq: DelayedQueue, other: DelayedQueue) -> None:
    assert wq.try_poll() is None
    other.offer("late", b"", other.now() - timedelta(seconds=60))
    assert wq.try_poll() is None
    wq.reset_watermarks()
    got = wq.try_poll()
    assert got is not None and got.key == "late"


def test_a_floor_above_now_is_ignored(database_url: str, ticker: Ticker) -> None:
    """A clock stepped back (here: the injected one) must not hide everything until a rescan."""
    from _workers import FakeClock

    clock = FakeClock()
    with DelayedQueue(database_url, kind="test", clock=clock, low_watermark=True) as q, \
            DelayedQueue(database_url, kind="test", clock=clock) as producer:
        q.watermarks = LowWatermarks(q._probe_below, RESCAN_S, monotonic=ticker)
        clock.advance(100)
        assert q.try_poll() is None
        clock.advance(-100)
        producer.offer("k", b"", clock() - timedelta(seconds=1))
        got = q.try_poll()
        assert got is not None and got.key == "k"


def test_priority_kinds_keep_floors_of_kinds_never_reached(wq: DelayedQueue) -> None:
    hi, lo = wq.with_kind("hi"), wq.with_kind("lo")
    now = wq.now()
    for i in range(3):
        hi.offer(f"h{i}", b"", now - timedelta(seconds=10 - i))
    lo.offer("l0", b"", now - timedelta(seconds=30))
    assert wq.watermarks is not None
    got = wq.try_poll_many(2, ["hi", "lo"])
    assert [e.key for e in got] == ["h0", "h1"]
    assert wq.watermarks.low("lo") is None, "never scanned: nothing learnt"
    got = wq.try_poll_many(5, ["hi", "lo"])
    assert [e.key for e in got] == ["h2", "l0"]


def test_a_lowering_during_a_poll_survives_its_result() -> None:
    marks = LowWatermarks(no_probe, RESCAN_S, monotonic=Ticker())
    marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000)
    assert marks.low("k") == 5_000
    ticket = marks.begin(["k"])
    assert ticket.lows == [5_000]
    marks.lower("k", 4_000)  # a NOTIFY for a row the poll's snapshot may not see
    marks.finish(ticket, {}, 10, 0, 9_000)
    assert marks.low("k") == 4_000
    ticket = marks.begin(["k"])
    marks.reset()
    marks.finish(ticket, {}, 10, 0, 9_000)
    assert marks.low("k") is not None and marks.low("k") < 0, "a reset during a poll wins"
    ticket = marks.begin(["k"])
    marks.lower("k", 1_000)
    marks.abort(ticket)
    assert marks.low("k") is not None and marks.low("k") <= 1_000


def test_two_identical_polls_each_keep_their_lowering() -> None:
    """Two consumers' polls that begin with the same floors are still two polls: the first to
    finish must not take the other's record of a lowering with it (found by the benchmark)."""
    marks = LowWatermarks(no_probe, RESCAN_S, monotonic=Ticker())
    marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000)
    a, b = marks.begin(["k"]), marks.begin(["k"])
    marks.finish(b, {}, 10, 0, 6_000)
    marks.lower("k", 5_500)
    marks.finish(a, {}, 10, 0, 7_000)
    assert marks.low("k") == 5_500


def test_next_due_is_searched_now_and_then_and_lowered_by_announcements(
    wq: DelayedQueue, other: DelayedQueue, ticker: Ticker
) -> None:
    """The search for the next due time walks every recent lease; with a watermark it runs on
    a poll from the bottom (first, after a reset) or once the remembered time has passed, and
    announcements lower it between."""
    now = other.now()
    at_ms = [int((now + timedelta(seconds=s)).timestamp() * 1000) for s in (60, 30, 10)]
    other.offer("in60", b"", now + timedelta(seconds=60))
    assert wq.poll(10) == ([], at_ms[0]), "first poll searches"
    other.offer("in30", b"", now + timedelta(seconds=30))
    assert wq.poll(10) == ([], at_ms[0]), "remembered, not searched"
    wq.lower_watermark("test", at_ms[1])  # the NOTIFY of in30
    assert wq.poll(10) == ([], at_ms[1])
    wq.offer("in10", b"", now + timedelta(seconds=10))  # own offers announce themselves
    assert wq.poll(10) == ([], at_ms[2])
    other.delete("in10")
    ticker.t += RESCAN_S
    assert wq.poll(10) == ([], at_ms[2]), "nor does the poll that launches a probe search"
    assert wq.watermarks is not None and wq.watermarks.wait_probes(WAIT_S)
    wq.reset_watermarks()
    assert wq.poll(10) == ([], at_ms[1]), "a reset searches again"


def test_due_now_announcements_do_not_trigger_a_search() -> None:
    """Every due-now publish is announced; only future times may lower the next due time, or
    each of them would make the following poll walk the lease region again."""
    marks = LowWatermarks(no_probe, RESCAN_S, monotonic=Ticker())
    first = marks.begin(["k"])
    assert first.want_next
    assert marks.finish(first, {}, 10, 0, 5_000, 9_000) == 9_000
    marks.lower("k", 4_000)  # due already: the poll window covers it
    ticket = marks.begin(["k"])
    assert not ticket.want_next
    assert marks.finish(ticket, {}, 10, 0, 5_100) == 9_000
    marks.lower("k", 7_000)  # a countdown: the next due time
    assert marks.finish(marks.begin(["k"]), {}, 10, 0, 5_200) == 7_000


def test_announced_rows_coming_due_search_at_most_once_an_interval() -> None:
    """Under a steady load every publish is announced a little ahead of the last poll and comes
    due by the next one. Each such row may now be leased by another consumer, so a search is
    due, but at most one per search interval (a search walks the whole lease region, acked
    leases too under a held snapshot); between searches the consumer is told to poll again
    when the next one is allowed."""
    clock = Ticker()
    marks = LowWatermarks(no_probe, RESCAN_S, monotonic=clock, next_search_interval_s=1.0)
    assert marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000, 65_000) == 65_000
    searches, polled_at = 0, 5_000
    for _ in range(150):  # 150 polls 10 ms apart, each preceded by one announced publish
        clock.t += 0.01
        marks.lower("k", polled_at + 5)
        polled_at += 10
        ticket = marks.begin(["k"])
        searches += ticket.want_next
        reported = marks.finish(ticket, {"k": polled_at - 5}, 10, 1, polled_at,
                                65_000 if ticket.want_next else None)
        assert reported is not None and reported <= 65_000
    assert searches == 1, "one search in 1.5 s of polls, not one per publish"


def test_a_row_another_consumer_took_is_searched_for_within_the_interval() -> None:
    """The heir's view of a killed consumer's task: the announced row came due, this consumer's
    poll found nothing (another one leased it). The lease is not known here, so the reported
    time brings a poll that searches within the search interval (a quarter of the lease at
    most), and that search's answer (the other consumer's lease end) is what the consumer
    then waits for."""
    assert next_search_interval(4_000) == 1.0 and next_search_interval(60_000) == 5.0
    clock = Ticker()
    marks = LowWatermarks(no_probe, RESCAN_S, monotonic=clock, next_search_interval_s=1.0)
    assert marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000, None) is None
    marks.lower("k", 5_100)
    clock.t += 0.2
    ticket = marks.begin(["k"])
    assert not ticket.want_next, "searched 0.2 s ago"
    retry = marks.finish(ticket, {}, 10, 0, 5_200)
    assert retry == 5_200 + 800, "poll again when a search is allowed"
    clock.t += 0.8
    ticket = marks.begin(["k"])
    assert ticket.want_next
    assert marks.finish(ticket, {}, 10, 0, 6_000, 9_100) == 9_100  # the other's lease end
    ticket = marks.begin(["k"])
    assert not ticket.want_next
    assert marks.finish(ticket, {}, 10, 0, 6_100) == 9_100


class RecordingProbe:
    """A probe that records (start, floor) per call and finds nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, int]] = []

    def __call__(self, kinds: list[str], starts: list[int | None], floors: list[int]
                 ) -> list[tuple[str, int]]:
        self.calls.extend(zip(starts, floors, strict=True))
        return []


def probe_once(marks: LowWatermarks, ticker: Ticker, polled_at: int) -> tuple[int | None, int]:
    ticker.t += RESCAN_S
    marks.finish(marks.begin(["k"]), {}, 10, 0, polled_at)
    assert marks.wait_probes(WAIT_S)
    return marks.probe.calls[-1]  # type: ignore[attr-defined]


def test_the_probe_starts_at_the_lowest_floor_since_the_last_one(ticker: Ticker) -> None:
    """A row gets below the floor unannounced only when a poll skipped it, at or above that
    poll's floor: the probe starts at the lowest floor held since the last probe (lowerings
    included), not at the bottom where a held snapshot keeps every dead entry."""
    marks = LowWatermarks(RecordingProbe(), RESCAN_S, monotonic=ticker)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000)
    assert probe_once(marks, ticker, 6_000) == (None, 6_000), "the first from the bottom"
    marks.finish(marks.begin(["k"]), {}, 10, 0, 7_000)
    marks.lower("k", 6_500)  # a NOTIFY: the floor held 6,500 for a while
    marks.finish(marks.begin(["k"]), {}, 10, 0, 8_000)
    assert probe_once(marks, ticker, 9_000) == (6_000, 9_000)
    marks.lower("k", 8_500)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 9_500)
    assert probe_once(marks, ticker, 10_000) == (8_500, 10_000)
    assert probe_once(marks, ticker, 11_000) == (10_000, 11_000)


def test_a_poll_running_while_the_probe_reads_the_floors_bounds_the_next_probe(
        ticker: Ticker) -> None:
    """A poll that began below the floor may still skip a row down there after the probe's
    snapshot: the next probe starts no higher than that poll's floor."""
    marks = LowWatermarks(RecordingProbe(), RESCAN_S, monotonic=ticker)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000)
    slow = marks.begin(["k"])  # starts at 5,000
    assert probe_once(marks, ticker, 6_000) == (None, 6_000)
    marks.finish(slow, {}, 10, 0, 6_100)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 7_000)
    assert probe_once(marks, ticker, 8_000) == (5_000, 8_000)


def test_every_tenth_probe_and_a_reset_start_from_the_bottom(ticker: Ticker) -> None:
    """The net for rows written without a NOTIFY (triggers disabled, a consumer that does not
    listen): now and then, and after a reset, the probe walks from the bottom."""
    from delayq_transport.core.queue.watermark import FULL_PROBE_EVERY

    marks = LowWatermarks(RecordingProbe(), RESCAN_S, monotonic=ticker)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 1_000)
    starts = [probe_once(marks, ticker, 1_000 * (i + 2))[0] for i in range(FULL_PROBE_EVERY)]
    assert starts[0] is None and starts[-1] is None
    assert all(s is not None for s in starts[1:-1])
    marks.reset()
    marks.finish(marks.begin(["k"]), {}, 10, 0, 50_000)
    assert probe_once(marks, ticker, 51_000)[0] is None


def test_a_failed_probe_leaves_its_range_to_the_next(ticker: Ticker) -> None:
    calls: list[tuple[int | None, int]] = []
    fail = [True]

    def flaky(kinds: list[str], starts: list[int | None], floors: list[int]
              ) -> list[tuple[str, int]]:
        calls.extend(zip(starts, floors, strict=True))
        if fail[0]:
            raise RuntimeError("statement timeout")
        return []

    marks = LowWatermarks(flaky, RESCAN_S, monotonic=ticker)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000)
    ticker.t += RESCAN_S
    marks.finish(marks.begin(["k"]), {}, 10, 0, 6_000)
    assert marks.wait_probes(WAIT_S) and calls[-1] == (None, 6_000)
    fail[0] = False
    ticker.t += RESCAN_S
    marks.finish(marks.begin(["k"]), {}, 10, 0, 7_000)
    assert marks.wait_probes(WAIT_S) and calls[-1] == (None, 7_000), "from the bottom again"


def test_a_countdown_announced_with_a_due_now_row_is_still_reported() -> None:
    """A due-now publish and a 2-s countdown announced before the same poll: the due-now one
    passes in that poll, the countdown is still what the consumer waits for (found by the
    acceptance test of the hub's due timer when only the earliest announcement was kept)."""
    marks = LowWatermarks(no_probe, RESCAN_S, monotonic=Ticker())
    assert marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000, None) is None
    marks.lower("k", 5_010)  # due now
    marks.lower("k", 7_010)  # countdown=2
    ticket = marks.begin(["k"])
    assert not ticket.want_next
    assert marks.finish(ticket, {"k": 5_010}, 10, 1, 5_020) == 7_010
