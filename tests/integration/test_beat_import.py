"""``delayq beat import`` from django-celery-beat's tables (made by its own models, in this test's
database), against real PostgreSQL.

Every imported entry, stored and read back as delayq_beat's DB-backed entry, fires in the next
week (across a DST change) at the instants django-celery-beat's own scheduler would
(``_djbeat.django_fires``: its ``ModelEntry.is_due`` on a simulated clock). A re-run writes
nothing; a refused entry stops the whole import; ``--disable-source`` and ``--undo`` change
exactly the source entries they name.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from _djbeat import django_database, django_fires
from click.testing import CliRunner
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    PeriodicTasks,
    SolarSchedule,
)

from delayq_beat import imports
from delayq_beat.installer import Installer
from delayq_beat.sources import DjangoBeatSource
from delayq_beat.store import BeatStore
from delayq_transport import Database, DelayedQueue
from delayq_transport.cli import main
from delayq_transport.core import InvalidInput
from delayq_transport.core.queue import to_ms
from delayq_transport.scheduling import bounds
from delayq_transport.scheduling.entries import EntrySpec
from delayq_transport.scheduling.times import occurrences

NY = ZoneInfo("America/New_York")
WEEKS = {"spring": datetime(2025, 3, 6, 17, 0, 7, tzinfo=UTC),
         "fall": datetime(2025, 10, 30, 17, 0, 7, tzinfo=UTC)}
WEEK = timedelta(days=7)


@pytest.fixture
def dj(database_url: str) -> Iterator[str]:
    """django-celery-beat's tables in this test's database, its ORM on them."""
    with django_database(database_url):
        yield database_url


@pytest.fixture
def store(database_url: str) -> Iterator[BeatStore]:
    with Database(database_url, min_size=0, max_size=2) as db:
        yield BeatStore(db)


@pytest.fixture
def source(dj: str) -> Iterator[DjangoBeatSource]:
    src = DjangoBeatSource(dj)
    yield src
    src.close()


def make(name: str, created: datetime, **fields: Any) -> PeriodicTask:
    """A task as the admin saves it, its ``date_changed`` then set to ``created`` (the
    simulated clock's start: django-celery-beat counts a never-run interval from it)."""
    for key in ("interval", "crontab", "solar", "clocked"):
        if key in fields and fields[key].pk is None:
            fields[key].save()
    task = PeriodicTask.objects.create(name=name, task="proj.tasks.report", **fields)
    PeriodicTask.objects.filter(pk=task.pk).update(date_changed=created)
    task.refresh_from_db()
    return task


def cron(**fields: str) -> CrontabSchedule:
    return CrontabSchedule(timezone=NY, **{"minute": "0", "hour": "*", "day_of_week": "*",
                                           "day_of_month": "*", "month_of_year": "*", **fields})


def delayq_fires(spec: EntrySpec, start: datetime, end: datetime) -> list[datetime]:
    """What delayq installs in (start, end) for an entry imported and first installed at
    ``start``."""
    first = to_ms(start) if bounds.needs_first_install(spec) else None
    found = occurrences(bounds.window(spec, first), start, end, spec.zone or UTC, 0)
    return [t for t in found if t < end]


def waiting(queue: DelayedQueue) -> int:
    return sum(s.due + s.scheduled for s in queue.status())


def imported_specs(store: BeatStore) -> dict[str, EntrySpec]:
    return {e.name: e.spec() for e in store.entries()}


@pytest.mark.parametrize("week", ["spring", "fall"])
def test_every_imported_entry_fires_as_django_celery_beat_would(
        week: str, source: DjangoBeatSource, store: BeatStore) -> None:
    start = WEEKS[week]
    tasks = [
        make("nine", start, crontab=cron(minute="0", hour="9")),
        make("gap", start, crontab=cron(minute="30", hour="2")),
        make("twice", start, crontab=cron(minute="*/20", hour="1-3")),
        make("weekdays", start, crontab=cron(minute="15", hour="8,17", day_of_week="mon-fri"),
             queue="reports", exchange="ex", routing_key="rk", priority=3,
             headers='{"h": 1}', args='[1, "a"]', kwargs='{"k": 2}'),
        make("every3d", start, interval=IntervalSchedule(every=3, period="days")),
        make("every90m", start, interval=IntervalSchedule(every=90, period="minutes")),
        make("ran", start, interval=IntervalSchedule(every=6, period="hours"),
             last_run_at=start - timedelta(hours=2)),
        make("from_start", start, interval=IntervalSchedule(every=4, period="hours"),
             start_time=start + timedelta(hours=5, minutes=7)),
        make("ends", start, crontab=cron(minute="0", hour="*/6"),
             expires=start + timedelta(days=3, hours=1)),
        make("sunrise", start, solar=SolarSchedule(event="sunrise", latitude=40.7,
                                                   longitude=-74.0)),
        make("once", start, clocked=ClockedSchedule(clocked_time=start + timedelta(days=2)),
             one_off=True),
        make("first_only", start, interval=IntervalSchedule(every=5, period="hours"),
             one_off=True),
    ]
    plan = imports.plan(source, store)
    assert {s.action for s in plan.steps} == {"create"}, [(s.name, s.reason) for s in plan.steps]
    imports.apply(plan, store)
    specs = imported_specs(store)
    assert set(specs) == {t.name for t in tasks}
    for task in tasks:
        ours = delayq_fires(specs[task.name], start, start + WEEK)
        theirs = django_fires(task, start, start + WEEK)
        if task.solar_id:  # ephem's instants: compared to the second
            ours, theirs = ([t.replace(microsecond=0) for t in x] for x in (ours, theirs))
        assert ours == theirs and ours, task.name
    weekdays = specs["weekdays"]
    assert (weekdays.zone, weekdays.args, weekdays.kwargs) == (NY, (1, "a"), {"k": 2})
    assert weekdays.options == {"queue": "reports", "exchange": "ex", "routing_key": "rk",
                                "priority": 3, "headers": {"h": 1}}
    assert specs["ends"].options["expires"] == specs["ends"].expires.isoformat()


def test_a_rerun_writes_nothing_and_a_change_updates_one_entry(
        source: DjangoBeatSource, store: BeatStore, database_url: str) -> None:
    now = datetime.now(UTC)
    make("a", now, interval=IntervalSchedule(every=10, period="seconds"), args="[1]")
    make("b", now, crontab=cron(minute="5"))

    def stamps() -> dict[str, int]:
        with psycopg.connect(database_url) as conn:
            return dict(conn.execute('SELECT name, "updatedAt" FROM delayq_schedule_entries'))

    imports.apply(imports.plan(source, store), store)
    first = stamps()
    again = imports.plan(source, store)
    assert [s.action for s in again.steps] == ["unchanged", "unchanged"]
    imports.apply(again, store)
    assert stamps() == first
    PeriodicTask.objects.filter(name="a").update(args="[2]")
    changed = imports.plan(source, store)
    assert [(s.name, s.action) for s in changed.steps] == [("a", "update"), ("b", "unchanged")]
    imports.apply(changed, store)
    assert imported_specs(store)["a"].args == (2,)
    assert stamps()["b"] == first["b"] and stamps()["a"] > first["a"]


def test_a_refused_entry_imports_nothing_unless_left_out(
        source: DjangoBeatSource, store: BeatStore) -> None:
    now = datetime.now(UTC)
    make("fine", now, interval=IntervalSchedule(every=10, period="seconds"))
    make("tiny", now, interval=IntervalSchedule(every=500, period="microseconds"))
    make("badjson", now, crontab=cron(), kwargs="[1]")
    make("taken", now, crontab=cron())
    store.add("taken", "other.task", 60)  # a DB-backed entry no import stored
    plan = imports.plan(source, store)
    refused = {s.name: s.reason for s in plan.refused}
    assert set(refused) == {"tiny", "badjson", "taken"}
    assert "shortest interval is 1 second" in refused["tiny"]
    assert "kwargs must be a JSON dict" in refused["badjson"]
    assert "no import from django-celery-beat stored" in refused["taken"]
    with pytest.raises(InvalidInput):
        imports.apply(plan, store)
    assert [e.name for e in store.entries()] == ["taken"]  # nothing written
    left = imports.plan(source, store, exclude=["tiny", "badjson", "taken"])
    assert not left.refused
    imports.apply(left, store)
    assert sorted(e.name for e in store.entries()) == ["fine", "taken"]
    assert store.entries()[1].definition["task"] == "other.task"  # untouched


def test_disable_source_and_undo_change_exactly_their_entries(
        source: DjangoBeatSource, database_url: str) -> None:
    now = datetime.now(UTC)
    make("on", now, interval=IntervalSchedule(every=10, period="seconds"))
    make("off", now, interval=IntervalSchedule(every=20, period="seconds"), enabled=False)
    make("once_ran", now, clocked=ClockedSchedule(clocked_time=now), one_off=True,
         total_run_count=1)
    PeriodicTasks.update_changed()
    mark = PeriodicTasks.last_change()
    runner = CliRunner()
    args = ["-d", database_url, "beat", "import", "--from", "django-celery-beat"]
    done = runner.invoke(main, [*args, "--disable-source"])
    assert done.exit_code == 0, done.output
    enabled = dict(PeriodicTask.objects.values_list("name", "enabled"))
    assert enabled == {"on": False, "off": False, "once_ran": False}
    assert PeriodicTasks.last_change() > mark  # django-celery-beat's beat sees the change
    with Database(database_url, min_size=0, max_size=2) as db:
        store = BeatStore(db)
        assert {e.name: e.enabled for e in store.entries()} == {
            "on": True, "off": False, "once_ran": False}
        again = runner.invoke(main, [*args, "--disable-source"])
        said = " ".join(again.output.split())
        assert "3 unchanged" in said and "disabled in django-celery-beat: none" in said
        queue = DelayedQueue(db)
        Installer(queue, store, UTC).refresh({})
        assert waiting(queue) > 0
        undone = runner.invoke(main, [*args, "--undo"])
        assert undone.exit_code == 0, undone.output
        assert store.entries() == [] and store.installed() == []
        assert waiting(queue) == 0
    # As they were: django-celery-beat itself disables the one-off that ran
    assert dict(PeriodicTask.objects.values_list("name", "enabled")) == {
        "on": True, "off": False, "once_ran": True}


def test_dry_run_prints_the_plan_and_writes_nothing(dj: str, database_url: str) -> None:
    make("pulse", datetime.now(UTC), interval=IntervalSchedule(every=10, period="seconds"))
    done = CliRunner().invoke(main, ["-d", database_url, "beat", "import", "--from",
                                     "django-celery-beat", "--dry-run", "--disable-source"],
                              env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.output
    assert "pulse" in done.output and "create" in done.output
    # Not a terminal (CI, a deploy log): the row is one line, its note not cut at 80 columns.
    row = next(line for line in done.stdout.splitlines() if line.startswith("│ pulse "))
    assert "disabled in django-celery-beat" in row, done.stdout
    assert "dry run: 1 create; to disable in django-celery-beat: pulse" in " ".join(
        done.output.split())
    assert PeriodicTask.objects.get(name="pulse").enabled
    with Database(database_url, min_size=0, max_size=1) as db:
        assert BeatStore(db).entries() == []
