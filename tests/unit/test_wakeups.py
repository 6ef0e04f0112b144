"""Complete wake-ups (core/queue/announce.py) and the consumer's search markers
(core/queue/watermark.py), without PostgreSQL: what a wake-up lists, and that a time left out is
never lost."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq_transport.core import InvalidInput
from delayq_transport.core.queue import announce, validate_kind, watermark
from delayq_transport.core.queue.announce import MARKER_PREFIX, Wakeups, marker_payload
from delayq_transport.core.queue.listen import _parse
from delayq_transport.core.queue.watermark import LowWatermarks


class Ticker:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def no_probe(kinds: list[str], starts: list[int | None], floors: list[int]
             ) -> list[tuple[str, int]]:
    return []


@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 5_000)), max_size=400),
       st.integers(1, 50))
def test_every_time_added_is_listed_or_behind_its_kinds_marker(
        rows: list[tuple[str, int]], cap: int) -> None:
    old = announce.MAX_LISTED
    announce.MAX_LISTED = cap
    try:
        wakeups = Wakeups()
        for i in range(0, len(rows), 7):  # added in pieces, as publishes note them
            wakeups.add(rows[i : i + 7])
        merged = Wakeups()
        merged.update(wakeups)  # restore() after a failed carry: the same coverage
    finally:
        announce.MAX_LISTED = old
    for w in (wakeups, merged):
        for kind, at in rows:
            listed = at in w.times.get(kind, set())
            assert listed or w.marks.get(kind, at + 1) <= at, (kind, at)
        assert all(len(listed) <= cap for listed in w.times.values())
        payloads = w.payloads()
        assert len(payloads) == len(set(payloads)), "each time once"


def test_payloads_list_each_distinct_time_then_the_markers() -> None:
    w = Wakeups()
    w.add([("k", 30), ("k", 10), ("k", 30), ("j", 5)])
    w.mark("k", 99)
    assert w.payloads() == ["k:10", "k:30", "j:5", marker_payload("k", 99)]
    assert bool(Wakeups()) is False and bool(w) is True


def test_a_marker_is_parsed_as_itself_and_as_a_due_time() -> None:
    assert _parse("a:b:12") == [("a:b", 12)]
    assert _parse(marker_payload("k", 7)) == [(MARKER_PREFIX + "k", 7), ("k", 7)]
    assert _parse("k:not-a-time") == [], "skipped, never a crash of the consumer"


def test_no_kind_can_be_taken_for_a_marker() -> None:
    with pytest.raises(InvalidInput, match="reserved for wake-ups"):
        validate_kind(MARKER_PREFIX + "k")


def test_a_marker_ahead_is_a_time_to_wake_at_and_its_passing_brings_a_search() -> None:
    clock = Ticker()
    marks = LowWatermarks(no_probe, 3600.0, monotonic=clock, next_search_interval_s=3600.0)
    assert marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000, None) is None
    clock.t += 1
    marks.lower("k", 6_000, search=True)  # rows from 6,000 on were not listed
    ticket = marks.begin(["k"])
    assert not ticket.want_next
    assert marks.finish(ticket, {}, 10, 0, 5_100) == 6_000, "wake at the marker"
    ticket = marks.begin(["k"])
    assert marks.finish(ticket, {"k": 6_000}, 10, 1, 6_000) == 6_000, "poll again at once"
    ticket = marks.begin(["k"])
    assert ticket.want_next, "and that poll searches, however recent the last search"
    assert marks.finish(ticket, {}, 10, 0, 6_001, 6_500) == 6_500
    ticket = marks.begin(["k"])
    assert not ticket.want_next, "the marker is done"


def test_a_search_after_the_marker_arrived_covers_it() -> None:
    clock = Ticker()
    marks = LowWatermarks(no_probe, 3600.0, monotonic=clock, next_search_interval_s=3600.0)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000, None)
    marks.lower("k", 6_000, search=True)
    marks.reset()  # the next poll searches from the bottom anyway
    clock.t += 1
    ticket = marks.begin(["k"])
    assert ticket.want_next
    assert marks.finish(ticket, {}, 10, 0, 5_100, 6_000) == 6_000
    marks.lower("k", 7_000, search=True)
    clock.t += 1
    assert marks.finish(marks.begin(["k"]), {"k": 6_000}, 10, 1, 6_000) == 6_000, \
        "the searched time passed: poll again at once"
    searching = marks.begin(["k"])
    assert searching.want_next  # began after the marker arrived: its search sees those rows
    assert marks.finish(searching, {}, 10, 0, 6_001, 6_900) == 6_900
    assert marks.finish(marks.begin(["k"]), {}, 10, 0, 6_002) == 6_900, \
        "the marker is done: the searched time is what comes next"


def test_past_max_announced_a_time_becomes_a_marker_not_a_loss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watermark, "MAX_ANNOUNCED", 3)
    clock = Ticker()
    marks = LowWatermarks(no_probe, 3600.0, monotonic=clock, next_search_interval_s=3600.0)
    marks.finish(marks.begin(["k"]), {}, 10, 0, 5_000, None)
    for at in (6_000, 7_000, 8_000, 9_000, 5_500):
        marks.lower("k", at)
    reported = marks.finish(marks.begin(["k"]), {}, 10, 0, 5_001)
    assert reported == 5_500, "kept the earliest as the marker"
    assert marks.finish(marks.begin(["k"]), {"k": 5_500}, 10, 1, 5_500) == 5_500
    assert marks.begin(["k"]).want_next, "searches on from the marker"
