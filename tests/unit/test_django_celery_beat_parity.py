"""Schedule semantics against django-celery-beat's own objects: for an entry of each kind, a week
of occurrences (across a DST change in America/New_York) equals what django-celery-beat's
scheduler would fire, stepped on a simulated clock through its real ``ModelEntry.is_due`` and
schedule objects (no database: the model instances are never saved). Where django-celery-beat
differs on purpose, the difference is asserted and documented (docs/how-to/beat.md).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from _djbeat import django_fires
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from delayq_beat.entries import make_spec
from delayq_transport.core.queue import to_ms
from delayq_transport.scheduling import bounds
from delayq_transport.scheduling.entries import EntrySpec
from delayq_transport.scheduling.times import occurrences

NY = ZoneInfo("America/New_York")
#: Weeks with a DST change in New York: spring forward on 2025-03-09, fall back on 2025-11-02.
WEEKS = {"spring": datetime(2025, 3, 6, 17, 0, 7, tzinfo=UTC),
         "fall": datetime(2025, 10, 30, 17, 0, 7, tzinfo=UTC)}
WEEK = timedelta(days=7)


def from_model(task: PeriodicTask) -> EntrySpec:
    """The delayq entry of a django-celery-beat task: every field carried (as an importer
    would), an interval anchored at its first install (django-celery-beat counts from the
    entry's creation, then from each run)."""
    options: dict[str, Any] = {k: getattr(task, k) for k in
                               ("queue", "exchange", "routing_key", "priority")
                               if getattr(task, k) is not None}
    options["headers"] = {**json.loads(task.headers or "{}"), "periodic_task_name": task.name}
    for key, value in (("delayq_start_time", task.start_time),
                       ("delayq_expires", task.expires), ("delayq_one_off", task.one_off)):
        if value:
            options[key] = value
    if task.interval is not None and task.start_time is None:
        options["delayq_anchor"] = "first_install"  # with a start time: anchored there
    return make_spec(task.name, task.task, task.schedule, [], {}, options,
                     enabled=task.enabled)


def delayq_fires(spec: EntrySpec, start: datetime, end: datetime) -> list[datetime]:
    """What delayq installs in [start, end) for an entry first installed at ``start`` (the
    instant django-celery-beat's entry above was created)."""
    first = to_ms(start) if bounds.needs_first_install(spec) else None
    window = bounds.window(spec, first)
    zone = spec.zone or UTC
    found = occurrences(window, start - timedelta(milliseconds=1), end, zone, 0)
    return [t for t in found if t < end]


def both(task: PeriodicTask, week: str = "fall") -> tuple[list[datetime], list[datetime]]:
    start = WEEKS[week]
    return (delayq_fires(from_model(task), start, start + WEEK),
            django_fires(task, start, start + WEEK))


def seconds(times: list[datetime]) -> list[datetime]:
    return [t.replace(microsecond=0) for t in times]


def cron(**fields: str) -> CrontabSchedule:
    return CrontabSchedule(timezone=NY, **{"minute": "0", "hour": "*", "day_of_week": "*",
                                           "day_of_month": "*", "month_of_year": "*", **fields})


def task(name: str, **schedule: Any) -> PeriodicTask:
    return PeriodicTask(name=name, task="proj.tasks.report", **schedule)


@pytest.mark.parametrize("week", ["spring", "fall"])
@pytest.mark.parametrize("fields", [
    {"minute": "0", "hour": "9"},                       # 09:00 New York, not 09:00 UTC
    {"minute": "30", "hour": "2"},                      # in the spring-forward gap
    {"minute": "30", "hour": "1"},                      # repeated at fall back: once
    {"minute": "*/20", "hour": "1-3"},
    {"minute": "15", "hour": "8,17", "day_of_week": "mon-fri"},
    {"minute": "0", "hour": "*"},                       # hourly (fall back: see below)
], ids=["9am", "2:30", "1:30", "every-20-min-1-3", "weekdays", "hourly"])
def test_crontab_in_its_own_zone_fires_as_django_celery_beat(week: str, fields: dict) -> None:
    ours, theirs = both(task("c", crontab=cron(**fields)), week)
    if fields == {"minute": "0", "hour": "*"} and week == "fall":
        # The one difference: django-celery-beat (Celery's crontab) skips the repeated 01:00
        # at fall back; delayq runs an hourly crontab every real hour (25 runs that day).
        extra = [t for t in ours if t not in theirs]
        assert [t.astimezone(NY).strftime("%m-%d %H:%M %Z") for t in extra] == \
            ["11-02 01:00 EST"]
        ours = [t for t in ours if t not in extra]
    assert ours == theirs and len(ours) >= 5


def test_the_zone_is_the_entrys_not_the_apps() -> None:
    ours, _ = both(task("c", crontab=cron(minute="0", hour="9")))
    assert {t.astimezone(NY).hour for t in ours} == {9}
    assert {t.hour for t in ours} == {13, 14}  # EDT before Nov 2, EST after


@pytest.mark.parametrize("week", ["spring", "fall"])
@pytest.mark.parametrize(("every", "period"), [(3, "days"), (90, "minutes"), (1, "hours")])
def test_interval_counts_from_its_first_install(week: str, every: int, period: str) -> None:
    ours, theirs = both(task("i", interval=IntervalSchedule(every=every, period=period)), week)
    assert ours == theirs and ours[0] == WEEKS[week] + timedelta(**{period: every})


def test_interval_with_start_time_fires_from_it() -> None:
    start = WEEKS["fall"] + timedelta(hours=5, minutes=7)
    ours, theirs = both(task("s", interval=IntervalSchedule(every=6, period="hours"),
                             start_time=start))
    assert ours == theirs and ours[0] == start


def test_crontab_with_start_time_differs_by_django_celery_beats_extra_run() -> None:
    """django-celery-beat sets a never-run entry's last run 30 years back when it has a start
    time, so a crontab fires once at the start time itself (within its 5 s max_interval);
    delayq fires the crontab's own instants from the start time on."""
    begin = WEEKS["fall"]
    start = begin + timedelta(days=1, minutes=7)
    t = task("cs", crontab=cron(minute="0", hour="9"), start_time=start)
    ours = delayq_fires(from_model(t), begin, begin + timedelta(days=3))
    theirs = django_fires(t, begin, begin + timedelta(days=3), max_sleep_s=5)
    assert timedelta(0) <= theirs[0] - start < timedelta(seconds=5) and theirs[1:] == ours
    assert [t.astimezone(NY).strftime("%m-%d %H:%M") for t in ours] == ["11-01 09:00",
                                                                       "11-02 09:00"]


def test_expires_ends_the_entry() -> None:
    end = WEEKS["fall"] + timedelta(days=3, hours=1)
    ours, theirs = both(task("e", crontab=cron(minute="0", hour="*/6"), expires=end))
    assert ours == theirs and max(ours) < end and len(ours) == 12


def test_solar_fires_at_the_same_events() -> None:
    ours, theirs = both(task("sun", solar=SolarSchedule(event="sunrise", latitude=40.7,
                                                        longitude=-74.0)))
    assert seconds(ours) == seconds(theirs) and len(ours) == 7


def test_clocked_one_off_fires_once() -> None:
    at = WEEKS["fall"] + timedelta(days=2, hours=3)
    ours, theirs = both(task("once", clocked=ClockedSchedule(clocked_time=at), one_off=True))
    assert ours == theirs == [at]


def test_one_off_interval_fires_its_first_occurrence_only() -> None:
    ours, theirs = both(task("first", interval=IntervalSchedule(every=4, period="hours"),
                             one_off=True))
    assert ours == theirs == [WEEKS["fall"] + timedelta(hours=4)]


def test_every_field_is_carried_and_the_name_header_is_django_celery_results() -> None:
    t = task("full", crontab=cron(minute="5"), queue="reports", exchange="ex",
             routing_key="rk", priority=3, headers='{"h": 1}', one_off=True,
             start_time=WEEKS["fall"], expires=WEEKS["fall"] + WEEK, enabled=False)
    spec = from_model(t)
    assert spec.options == {"queue": "reports", "exchange": "ex", "routing_key": "rk",
                            "priority": 3, "headers": {"h": 1, "periodic_task_name": "full"}}
    assert (spec.zone, spec.one_off, spec.enabled) == (NY, True, False)
    assert (spec.start_time, spec.expires) == (WEEKS["fall"], WEEKS["fall"] + WEEK)

