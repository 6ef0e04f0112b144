"""The engine's schedule semantics beyond Celery's: an entry's own time zone, anchored
intervals, one-off entries, start and end; their config hashes and their stored form."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab

from delayq_beat.entries import make_spec as celery_spec
from delayq_transport.core import InvalidInput
from delayq_transport.core.queue import to_ms
from delayq_transport.scheduling import bounds
from delayq_transport.scheduling.entries import entry_hash, make_spec, storable_options
from delayq_transport.scheduling.schedules import (
    Clocked,
    Interval,
    Window,
    parse_crontab,
    schedule_from_json,
    schedule_to_json,
)
from delayq_transport.scheduling.store import StoredEntry
from delayq_transport.scheduling.times import occurrences

NY = ZoneInfo("America/New_York")
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def times(spec, after: datetime = T0, until: datetime = T0 + 24 * HOUR, first=None):
    return occurrences(bounds.window(spec, first), after, until, spec.zone or UTC, 0)


def test_interval_defaults_to_the_epoch_and_can_be_anchored() -> None:
    week = timedelta(days=7)
    epoch = times(make_spec("w", "t", week), until=T0 + 15 * week)
    assert {t.strftime("%a %H:%M") for t in epoch} == {"Thu 00:00"}  # the epoch was a Thursday
    monday_9 = datetime(2030, 1, 7, 9, 30, tzinfo=UTC)
    anchored = make_spec("w", "t", week, options={"delayq_anchor": monday_9})
    assert times(anchored, until=T0 + 3 * week) == [monday_9, monday_9 + week, monday_9 + 2 * week]


def test_an_interval_with_a_start_time_fires_at_it_then_every_period() -> None:
    start = T0 + timedelta(minutes=7, seconds=3)
    spec = make_spec("s", "t", 3600.0, options={"delayq_start_time": start})
    assert times(spec, until=T0 + 4 * HOUR) == [start, start + HOUR, start + 2 * HOUR,
                                                start + 3 * HOUR]
    kept_on_epoch = make_spec("s", "t", 3600.0, options={"delayq_start_time": start,
                                                         "delayq_anchor": "epoch"})
    assert times(kept_on_epoch, until=T0 + 3 * HOUR) == [T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]


def test_an_interval_anchored_at_its_first_install_needs_the_ledger() -> None:
    spec = make_spec("f", "t", 600.0, options={"delayq_anchor": "first_install"})
    assert bounds.needs_first_install(spec)
    first = to_ms(T0 + timedelta(seconds=17))
    assert times(spec, until=T0 + HOUR, first=first)[:2] == [
        T0 + timedelta(minutes=10, seconds=17), T0 + timedelta(minutes=20, seconds=17)]
    with pytest.raises(ValueError, match="first install"):
        bounds.window(spec, None)


def test_start_is_inclusive_and_expires_exclusive() -> None:
    spec = make_spec("b", "t", 3600.0, options={"delayq_start_time": T0 + HOUR,
                                                "delayq_expires": T0 + 4 * HOUR,
                                                "delayq_anchor": "epoch"})
    assert times(spec) == [T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]


def test_one_offs_have_one_instant() -> None:
    at = T0 + timedelta(hours=5, minutes=3)
    clocked = make_spec("c", "t", Clocked(to_ms(at)))
    assert times(clocked) == [at] and times(clocked, after=at) == []
    first = make_spec("o", "t", 3600.0, options={"delayq_one_off": True})
    assert times(first, first=to_ms(T0 + timedelta(minutes=5))) == [T0 + HOUR]
    with_start = make_spec("o", "t", parse_crontab("0 9 * * *"),
                           options={"delayq_one_off": True, "delayq_start_time": T0})
    assert times(with_start, until=T0 + 72 * HOUR) == [datetime(2030, 1, 2, 9, tzinfo=UTC)]


def test_a_crontab_is_read_in_its_own_zone() -> None:
    spec = make_spec("ny", "t", parse_crontab("0 9 * * *"),
                     options={"delayq_tz": "America/New_York"})
    assert [t.astimezone(NY).hour for t in times(spec, until=T0 + 72 * HOUR)] == [9, 9, 9]
    own = celery_spec("ny", "t", _ZonedCrontab(NY, minute=0, hour=9))  # TzAwareCrontab-like
    assert own.zone == NY and entry_hash(own, NY) == entry_hash(spec, NY)


class _ZonedCrontab(crontab):
    """What django-celery-beat's TzAwareCrontab does: the zone set on the instance."""

    def __init__(self, tz: ZoneInfo, **fields: object) -> None:
        self.tz = tz
        super().__init__(**fields)


def test_new_fields_change_the_hash_and_their_absence_keeps_it() -> None:
    base = make_spec("e", "t", 600.0, options={"queue": "q"})
    plain = entry_hash(base, UTC)
    assert plain == entry_hash(make_spec("e", "t", 600.0, options={"queue": "q",
                                                                   "delayq_anchor": "epoch"}),
                               UTC)
    variants = [{"delayq_anchor": "first_install"}, {"delayq_anchor": T0},
                {"delayq_start_time": T0}, {"delayq_expires": T0}, {"delayq_one_off": True},
                {"delayq_tz": "America/New_York"}]
    hashes = {entry_hash(s, s.zone or UTC) for s in
              (make_spec("e", "t", 600.0, options={"queue": "q", **v}) for v in variants)}
    assert plain not in hashes and len(hashes) == len(variants)


@pytest.mark.parametrize("options", [
    {"delayq_anchor": "first_install"}, {"delayq_anchor": T0}, {"delayq_start_time": T0},
    {"delayq_expires": T0 + HOUR, "delayq_one_off": True}, {"delayq_tz": NY},
])
def test_a_stored_entry_reads_back_to_the_same_hash(options: dict) -> None:
    spec = make_spec("e", "t", 600.0, options={"queue": "q", **options})
    definition = {"task": "t", "schedule": schedule_to_json(spec.schedule), "args": [],
                  "kwargs": {}, "options": storable_options({"queue": "q", **options})}
    again = StoredEntry("e", definition, True, 0).spec()
    assert entry_hash(again, again.zone or UTC) == entry_hash(spec, spec.zone or UTC)
    assert again.schedule == spec.schedule


def test_clocked_json_round_trip() -> None:
    sched = Clocked(to_ms(T0))
    assert schedule_from_json(schedule_to_json(sched)) == sched
    assert Window(sched) != Window(sched, once=True)


@pytest.mark.parametrize(("options", "match"), [
    ({"delayq_tz": "Mars/Olympus"}, "unknown time zone"),
    ({"delayq_start_time": datetime(2030, 1, 1)}, "timezone-aware"),
    ({"delayq_expires": "soon"}, "ISO-8601"),
    ({"delayq_one_off": "yes"}, "true or false"),
    ({"delayq_anchor": "noon"}, "delayq_anchor"),
])
def test_bad_new_fields_name_the_problem(options: dict, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        make_spec("e", "t", 600.0, options=options)


def test_an_anchor_is_for_intervals_only() -> None:
    with pytest.raises(InvalidInput, match="interval schedules only"):
        make_spec("e", "t", parse_crontab("* * * * *"), options={"delayq_anchor": T0})
    with pytest.raises(InvalidInput, match="not both"):
        Interval(60.0, anchor_ms=0, from_first_install=True)
