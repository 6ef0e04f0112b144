"""Pure beat logic: key prefixes, config hashes, occurrence instants (DST included)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule, solar
from croniter import croniter

from delayq_beat.entries import (
    entry_hash,
    entry_name,
    key_prefix,
    make_spec,
    occurrences,
    parse_crontab,
    schedule_from_json,
    schedule_to_json,
)
from delayq_transport.core import InvalidInput

NY = ZoneInfo("America/New_York")


def local(times: list[datetime]) -> list[str]:
    return [t.astimezone(NY).strftime("%m-%d %H:%M %Z") for t in times]


@pytest.mark.parametrize("name,prefix", [
    ("a_b", "a_b"), ("50%", "50%25"), ("reports/daily", "reports%2Fdaily"), ("x%2Fy", "x%252Fy"),
])
def test_key_prefix_encodes_slash_and_percent_reversibly(name: str, prefix: str) -> None:
    assert key_prefix(name) == prefix
    assert entry_name(prefix) == name


@pytest.mark.parametrize("bad", ["", "  ", "a\nb", None, 3, "x" * 200])
def test_key_prefix_rejects_bad_names(bad: object) -> None:
    with pytest.raises(InvalidInput):
        key_prefix(bad)


def spec(**changes: object):
    base = dict(name="e", task="t.add", sched=crontab(minute="*/15"), args=(1, 2),
                kwargs={"x": 1}, options={"queue": "q"})
    base.update(changes)
    return make_spec(base.pop("name"), base.pop("task"), base.pop("sched"), **base)


def test_hash_is_stable_and_canonical() -> None:
    assert entry_hash(spec(), NY) == entry_hash(spec(), NY)
    # crontab compared by its expanded fields
    same = spec(sched=crontab(minute="0,15,30,45"))
    assert entry_hash(same, NY) == entry_hash(spec(), NY)


def test_hash_ignores_the_order_of_kwargs_and_options() -> None:
    """kwargs and options by value, not order: the same entry written with its keys in
    another order (another deploy, a dict rebuilt from JSON) keeps its installed rows."""
    one = spec(kwargs={"x": 1, "y": {"a": 1, "b": 2}},
               options={"queue": "q", "priority": 3, "headers": {"h1": 1, "h2": 2}})
    other = spec(kwargs={"y": {"b": 2, "a": 1}, "x": 1},
                 options={"headers": {"h2": 2, "h1": 1}, "priority": 3, "queue": "q"})
    assert entry_hash(one, NY) == entry_hash(other, NY)
    assert entry_hash(one, NY) != entry_hash(spec(kwargs={"x": 1, "y": {"a": 1, "b": 3}},
                                                  options=one.options), NY)


@pytest.mark.parametrize("change", [
    {"task": "t.other"}, {"sched": crontab(minute="*/10")}, {"sched": 900.0}, {"args": (1, 3)},
    {"kwargs": {"x": 2}}, {"options": {"queue": "r"}},
    {"options": {"queue": "q", "delayq_misfire": "skip"}},
])
def test_hash_covers_everything_that_shapes_an_occurrence(change: dict) -> None:
    assert entry_hash(spec(**change), NY) != entry_hash(spec(), NY)


def test_hash_covers_time_zone() -> None:
    assert entry_hash(spec(), NY) != entry_hash(spec(), ZoneInfo("Europe/Paris"))


def test_interval_occurrences_are_epoch_aligned_with_horizon_and_minimum() -> None:
    after = datetime(2024, 1, 1, 0, 0, 7, tzinfo=UTC)
    got = occurrences(schedule(timedelta(seconds=10)), after, after + timedelta(seconds=35), NY)
    assert [t.second for t in got] == [10, 20, 30, 40]
    few = occurrences(schedule(timedelta(hours=1)), after, after + timedelta(minutes=1), NY, 3)
    assert [t.hour for t in few] == [1, 2, 3]


@pytest.mark.parametrize("expr", ["*/7 * * * *", "5 3 * * *", "0 9-17/2 * * 1-5",
                                  "15 0 1,15 * *", "0 12 * 2 *"])
def test_crontab_matches_croniter_in_utc(expr: str) -> None:
    after = datetime(2024, 1, 30, 22, 13, tzinfo=UTC)
    ours = occurrences(parse_crontab(expr), after, after, ZoneInfo("UTC"), 50)
    it = croniter(expr, after)
    assert ours == [it.get_next(datetime) for _ in range(50)]


def test_spring_forward_nonexistent_time_runs_after_the_gap() -> None:
    after = datetime(2024, 3, 9, 12, tzinfo=UTC)
    got = occurrences(crontab(hour=2, minute=30), after, after, NY, 3)
    assert local(got) == ["03-10 03:30 EDT", "03-11 02:30 EDT", "03-12 02:30 EDT"]


def test_spring_forward_hourly_skips_the_missing_hour() -> None:
    day = datetime(2024, 3, 10, tzinfo=NY).astimezone(UTC)  # real hours, not wall hours
    got = occurrences(crontab(minute=0), day - timedelta(seconds=1),
                      day + timedelta(hours=23) - timedelta(seconds=1), NY, 1)
    assert len(got) == 23  # a 23-hour day
    assert local(got)[1:4] == ["03-10 01:00 EST", "03-10 03:00 EDT", "03-10 04:00 EDT"]
    assert len(set(got)) == len(got)


def test_fall_back_hourly_runs_every_real_hour() -> None:
    day = datetime(2024, 11, 3, tzinfo=NY).astimezone(UTC)
    got = occurrences(crontab(minute=0), day - timedelta(seconds=1),
                      day + timedelta(hours=25) - timedelta(seconds=1), NY, 1)
    assert len(got) == 25  # a 25-hour day, both 01:00s
    assert local(got)[1:4] == ["11-03 01:00 EDT", "11-03 01:00 EST", "11-03 02:00 EST"]


def test_fall_back_fixed_time_runs_once_at_first_instant() -> None:
    after = datetime(2024, 11, 2, 12, tzinfo=UTC)
    got = occurrences(crontab(hour=1, minute=30), after, after, NY, 3)
    assert local(got) == ["11-03 01:30 EDT", "11-04 01:30 EST", "11-05 01:30 EST"]


def test_two_wall_times_in_the_gap_stay_sorted_and_unique() -> None:
    after = datetime(2024, 3, 10, 5, tzinfo=UTC)
    got = occurrences(crontab(hour="2,3", minute="0,30"), after, after, NY, 3)
    assert local(got) == ["03-10 03:00 EDT", "03-10 03:30 EDT", "03-11 02:00 EDT"]


def test_crontab_that_never_fires_is_an_error() -> None:
    after = datetime(2024, 1, 1, tzinfo=UTC)
    with pytest.raises(InvalidInput, match="no occurrence"):
        occurrences(crontab(0, 0, day_of_week=1, day_of_month=29, month_of_year=2),
                    after, after, NY, 1)  # Feb 29 on a Monday: next in 2044


def test_solar_occurrences_are_daily_and_increasing() -> None:
    after = datetime(2024, 6, 1, tzinfo=UTC)
    got = occurrences(solar("sunrise", 40.7, -74.0), after, after, NY, 4)
    gaps = [(b - a).total_seconds() for a, b in zip(got, got[1:], strict=False)]
    assert all(23 * 3600 < g < 25 * 3600 for g in gaps)
    assert all(8 <= t.hour <= 10 for t in got)  # ~05:25 EDT is ~09:25 UTC


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(InvalidInput, match="timezone-aware"):
        occurrences(crontab(), datetime(2024, 1, 1), datetime(2024, 1, 2), NY)


@pytest.mark.parametrize("kwargs,match", [
    ({"sched": None}, "schedule"),
    ({"sched": "daily"}, "unsupported schedule"),
    ({"sched": 0.2}, "at least 1 second"),
    ({"task": ""}, "task must be"),
    ({"args": (object(),)}, "JSON-serialisable"),
    ({"options": {"delayq_misfire": "later"}}, "delayq_misfire"),
    ({"options": {"delayq_grace": -1}}, "delayq_grace"),
    ({"name": "bad\x00name"}, "control characters"),
])
def test_bad_entries_name_the_problem(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        spec(**kwargs)


@pytest.mark.parametrize("text", ["99 * * * *", "* * *", "* 25 * * *", "a b c d e"])
def test_invalid_crontab_text(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_crontab(text)


@pytest.mark.parametrize("sched", [crontab(minute="*/5", hour="1-3"), schedule(30.0),
                                   solar("sunset", 10, 20)])
def test_schedule_json_round_trip_keeps_the_hash(sched: object) -> None:
    again = schedule_from_json(schedule_to_json(sched))
    assert entry_hash(spec(sched=again), NY) == entry_hash(spec(sched=sched), NY)
