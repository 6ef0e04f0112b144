"""Pure-Python parts of scheduling and storage naming: no database needed."""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from delayq_transport import DailySchedule, InvalidInput
from delayq_transport.core.integrations.cron import config_hash, like_escape, periodic_times
from delayq_transport.core.queue import duration_ms, from_ms, to_ms
from delayq_transport.formats.celery import (
    PRIORITY_SEP,
    kind_for,
    kinds_for,
    priority_bucket,
    queue_of_kind,
)

NY = ZoneInfo("America/New_York")
S = timedelta(seconds=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# -- periodic_times ----------------------------------------------------------------------------


def test_periodic_times_are_epoch_aligned_and_after_now() -> None:
    assert periodic_times(from_ms(10_000), S, 3 * S) == [from_ms(t) for t in (11_000, 12_000,
                                                                               13_000)]
    assert periodic_times(from_ms(10_300), S, 3 * S) == [from_ms(t) for t in (11_000, 12_000,
                                                                               13_000)]
    five = timedelta(minutes=5)
    got = periodic_times(utc(2024, 1, 1, 10, 7, 30), five, timedelta(minutes=20))
    assert got == [utc(2024, 1, 1, 10, m) for m in (10, 15, 20, 25)]


def test_periodic_times_reach_the_end_of_a_horizon_that_is_not_a_multiple() -> None:
    assert periodic_times(from_ms(10_900), S, 2.5 * S) == [from_ms(t) for t in (11_000, 12_000,
                                                                               13_000)]


def test_periodic_times_have_at_least_one_occurrence() -> None:
    assert periodic_times(utc(2024, 1, 1, 10, 0, 1), timedelta(hours=1), S) == [
        utc(2024, 1, 1, 11)
    ]


def test_periodic_times_do_not_depend_on_the_caller_zone() -> None:
    now = datetime(2024, 1, 1, 5, 0, 1, tzinfo=timezone(timedelta(hours=-5)))
    assert periodic_times(now, timedelta(hours=1), 2 * timedelta(hours=1)) == [
        utc(2024, 1, 1, 11), utc(2024, 1, 1, 12)
    ]


def test_periodic_times_refuse_naive_now() -> None:
    with pytest.raises(InvalidInput, match="timezone-aware"):
        periodic_times(datetime(2024, 1, 1), S, S)


@given(
    now_ms=st.integers(0, 4_000_000_000_000),
    period_ms=st.integers(1, 86_400_000),
    periods=st.integers(0, 50),
    rest=st.floats(0, 1, exclude_max=True),
)
def test_periodic_times_properties(now_ms: int, period_ms: int, periods: int, rest: float) -> None:
    horizon_ms = periods * period_ms + int(rest * period_ms)
    period, horizon = timedelta(milliseconds=period_ms), timedelta(milliseconds=horizon_ms)
    got = [to_ms(t) for t in periodic_times(from_ms(now_ms), period, horizon)]
    assert got and all(t % period_ms == 0 for t in got)
    assert now_ms < got[0] <= now_ms + period_ms, "the very next multiple comes first"
    assert all(b - a == period_ms for a, b in zip(got, got[1:], strict=False))
    assert got[-1] <= now_ms + max(horizon_ms, period_ms)
    assert got[-1] + period_ms > now_ms + horizon_ms, "nothing inside the horizon is left out"


@given(st.integers(-62_135_596_800_000, 253_402_300_799_999))
@example(1001)
def test_epoch_ms_round_trip_is_exact(ms: int) -> None:
    """Keys and scheduledAt carry these numbers: a float round trip dropped 1 ms (1001 -> 1000)."""
    assert to_ms(from_ms(ms)) == ms


def test_conversions_use_whole_milliseconds() -> None:
    assert to_ms(utc(1970, 1, 1, 0, 0, 2) + timedelta(microseconds=156_999)) == 2156
    assert to_ms(datetime(1970, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == 0
    assert duration_ms(timedelta(milliseconds=1001)) == duration_ms(1.001) == 1001


# -- DailySchedule -----------------------------------------------------------------------------


def test_daily_schedule_in_utc() -> None:
    schedule = DailySchedule((time(2),))
    assert schedule.occurrences(utc(2026, 2, 8, 2), utc(2026, 2, 11, 2)) == [
        utc(2026, 2, 9, 2), utc(2026, 2, 10, 2), utc(2026, 2, 11, 2)
    ], "after is exclusive, until inclusive"


def test_spring_forward_runs_a_missing_time_after_the_gap() -> None:
    """2024-03-10 in New York: 02:00 EST jumps to 03:00 EDT."""
    schedule = DailySchedule((time(2, 30), time(1, 30), time(4)), NY)
    day = schedule.occurrences(utc(2024, 3, 10, 0), utc(2024, 3, 10, 23))
    assert day == [utc(2024, 3, 10, 6, 30), utc(2024, 3, 10, 7, 30), utc(2024, 3, 10, 8)]
    assert [t.astimezone(NY).strftime("%H:%M %Z") for t in day] == [
        "01:30 EST", "03:30 EDT", "04:00 EDT"
    ]


def test_spring_forward_never_runs_twice_when_the_shifted_time_is_also_scheduled() -> None:
    schedule = DailySchedule((time(2, 30), time(3, 30)), NY)
    assert schedule.occurrences(utc(2024, 3, 10, 0), utc(2024, 3, 10, 23)) == [
        utc(2024, 3, 10, 7, 30)
    ]


def test_fall_back_runs_a_repeated_time_once_at_its_first_instant() -> None:
    """2024-11-03 in New York: 02:00 EDT falls back to 01:00 EST, so 01:xx happens twice."""
    schedule = DailySchedule((time(1, 30), time(2, 30)), NY)
    day = schedule.occurrences(utc(2024, 11, 3, 0), utc(2024, 11, 3, 23))
    assert day == [utc(2024, 11, 3, 5, 30), utc(2024, 11, 3, 7, 30)]
    assert [t.astimezone(NY).strftime("%H:%M %Z") for t in day] == ["01:30 EDT", "02:30 EST"]


def test_daily_schedule_keeps_wall_time_across_the_change() -> None:
    schedule = DailySchedule((time(9),), NY)
    got = schedule.occurrences(utc(2024, 3, 8, 20), utc(2024, 3, 11, 20))
    assert got == [utc(2024, 3, 9, 14), utc(2024, 3, 10, 13), utc(2024, 3, 11, 13)]


def test_daily_schedule_needs_a_time() -> None:
    with pytest.raises(InvalidInput, match="at least one time"):
        DailySchedule((), NY)


# -- LIKE escaping -----------------------------------------------------------------------------


def like_matches(pattern: str, text: str) -> bool:
    """PostgreSQL's LIKE with ESCAPE '\\', in Python."""
    regex, chars = "", iter(pattern)
    for c in chars:
        if c == "\\":
            regex += re.escape(next(chars))
        else:
            regex += {"%": ".*", "_": "."}.get(c, re.escape(c))
    return re.fullmatch(regex, text, re.DOTALL) is not None


def test_like_escape_examples() -> None:
    assert like_escape("plain-name.1") == "plain-name.1"
    assert like_escape("a_b%c\\d") == "a\\_b\\%c\\\\d"


@given(st.text(alphabet="ab_%\\/x", max_size=8), st.text(alphabet="ab_%\\/x", max_size=12))
def test_an_escaped_prefix_matches_exactly_the_texts_it_starts(prefix: str, text: str) -> None:
    assert like_matches(like_escape(prefix) + "%", text) == text.startswith(prefix)


# -- config_hash -------------------------------------------------------------------------------


def test_config_hash_is_stable_and_shaped_for_keys() -> None:
    """Pinned: a different hash for the same config would make installers delete each other's
    rows during an upgrade."""
    assert config_hash("periodic-tick", timedelta(seconds=60)) == (
        "0586b85b2bb944265ee5aa57c5d64234"
    )
    assert re.fullmatch(r"[0-9a-f]{32}", config_hash("a", 1, None))


def test_config_hash_separates_configs() -> None:
    variants = [("a", "b"), ("b", "a"), ("a\x1fb",), ("ab",), ("a", "b", None), (1,), ("1",)]
    assert len({config_hash(*v) for v in variants}) == len(variants)


# -- kinds and priority buckets ----------------------------------------------------------------


@pytest.mark.parametrize(
    "priority, bucket",
    [(0, 0), (None, 0), (1, 0), (2, 0), (3, 3), (5, 3), (6, 6), (8, 6), (9, 9), (42, 9),
     (-3, 0), ("7", 6), ("high", 0)],
)
def test_priority_bucket(priority: object, bucket: int) -> None:
    assert priority_bucket(priority) == bucket


def test_kind_for_and_back() -> None:
    assert kind_for("celery") == kind_for("celery", 2) == "celery"
    assert kind_for("celery", 7) == f"celery{PRIORITY_SEP}6"
    assert kinds_for("q") == ["q", f"q{PRIORITY_SEP}3", f"q{PRIORITY_SEP}6", f"q{PRIORITY_SEP}9"]
    assert [queue_of_kind(k) for k in kinds_for("q")] == [("q", 0), ("q", 3), ("q", 6), ("q", 9)]
    assert kind_for("q", 5, steps=(0, 5)) == f"q{PRIORITY_SEP}5"
