"""``delayq beat import`` from RedBeat (its entries saved by RedBeat itself in a real Redis),
from Celery's ``celerybeat-schedule`` file (written by Celery's own PersistentScheduler), and
from an app's ``beat_schedule``, against real PostgreSQL: every field carried, what cannot be
carried refused with its reason, RedBeat's own disable, and a file's or an app's entries never
disabled."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery, beat
from celery.schedules import crontab, schedule
from click.testing import CliRunner
from redbeat.schedulers import RedBeatSchedulerEntry
from redbeat.schedules import rrule

from delayq_beat import imports
from delayq_beat.sources import AppSource, RedBeatSource, ScheduleFileSource
from delayq_beat.store import BeatStore
from delayq_transport import Database
from delayq_transport.cli import main
from delayq_transport.scheduling.schedules import Crontab, Interval

REDIS_URL = "redis://127.0.0.1:6379/7"  # a database number no other test uses
PREFIX = "redbeat-t:"


@pytest.fixture
def store(database_url: str) -> Iterator[BeatStore]:
    with Database(database_url, min_size=0, max_size=2) as db:
        yield BeatStore(db)


@pytest.fixture
def redbeat_app() -> Iterator[Celery]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    app = Celery("redbeat_t", set_as_current=False)
    app.conf.update(redbeat_redis_url=REDIS_URL, redbeat_key_prefix=PREFIX,
                    timezone="America/Chicago")
    yield app
    client.flushdb()
    client.close()


def save(app: Celery, name: str, sched: object, **fields: object) -> RedBeatSchedulerEntry:
    entry = RedBeatSchedulerEntry(name, "proj.task", sched, app=app, **fields)  # type: ignore
    return entry.save()


def by_name(items: list) -> dict:
    return {i.name: i for i in items}


def test_redbeat_entries_carried_refused_disabled_and_restored(
        redbeat_app: Celery, store: BeatStore, database_url: str) -> None:
    ran = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
    save(redbeat_app, "every_minute", schedule(timedelta(minutes=1)), args=[1],
         kwargs={"k": 2}, options={"queue": "q", "priority": 4, "headers": {"h": "x"}})
    save(redbeat_app, "nine", crontab(minute=0, hour=9))
    save(redbeat_app, "paused", schedule(timedelta(hours=1)), enabled=False)
    save(redbeat_app, "relative", schedule(timedelta(hours=1), relative=True))
    save(redbeat_app, "rule", rrule("HOURLY", dtstart=datetime.now(UTC)))
    ran_entry = save(redbeat_app, "ran", schedule(timedelta(hours=6)))
    ran_entry.reschedule(last_run_at=ran)

    no_zone = by_name(RedBeatSource(REDIS_URL, PREFIX).read())
    assert "give --tz" in no_zone["nine"].reason  # the app's zone is not in Redis
    items = by_name(RedBeatSource(REDIS_URL, PREFIX, ZoneInfo("America/Chicago")).read())
    assert "relative=True" in items["relative"].reason
    assert "'rrule' cannot be carried" in items["rule"].reason
    minute = items["every_minute"]
    assert (minute.task, minute.args, dict(minute.kwargs)) == ("proj.task", (1,), {"k": 2})
    assert {k: minute.options[k] for k in ("queue", "priority", "headers")} == {
        "queue": "q", "priority": 4, "headers": {"h": "x"}}
    assert minute.schedule == Interval(60.0)
    # RedBeat stores a new entry's save time as its last run, and counts from it
    assert isinstance(minute.options["delayq_anchor"], datetime)
    assert items["ran"].options["delayq_anchor"] == ran  # counted from its last run
    assert items["nine"].schedule == Crontab.of(0, 9)
    assert items["nine"].options["delayq_tz"] == "America/Chicago"
    assert items["paused"].enabled is False

    args = ["-d", database_url, "beat", "import", "--from", "redbeat", REDIS_URL,
            "--redbeat-prefix", PREFIX, "--tz", "America/Chicago"]
    runner = CliRunner()
    refused = runner.invoke(main, [*args, "--disable-source"])
    assert refused.exit_code == 1 and "2 entries refused" in " ".join(refused.output.split())
    assert store.entries() == []
    done = runner.invoke(main, [*args, "--disable-source", "--exclude", "relative",
                                "--exclude", "rule"])
    assert done.exit_code == 0, done.output
    assert {e.name: e.enabled for e in store.entries()} == {
        "every_minute": True, "nine": True, "paused": False, "ran": True}

    def enabled() -> dict[str, bool]:  # as RedBeat itself reads them
        return {n: RedBeatSchedulerEntry.from_key(PREFIX + n, app=redbeat_app).enabled
                for n in ("every_minute", "nine", "paused", "ran", "relative")}

    assert enabled() == {"every_minute": False, "nine": False, "paused": False, "ran": False,
                         "relative": True}
    assert RedBeatSchedulerEntry.from_key(PREFIX + "ran", app=redbeat_app).last_run_at == ran
    again = runner.invoke(main, [*args, "--exclude", "relative", "--exclude", "rule"])
    assert "4 unchanged" in " ".join(again.output.split()), again.output
    undone = runner.invoke(main, [*args, "--undo"])
    assert undone.exit_code == 0, undone.output
    assert store.entries() == []
    assert enabled() == {"every_minute": True, "nine": True, "paused": False, "ran": True,
                         "relative": True}


def test_schedule_file_written_by_celery_beat(tmp_path: Path, store: BeatStore) -> None:
    app = Celery("file_t", set_as_current=False)
    app.conf.timezone = "Asia/Tokyo"
    app.conf.beat_schedule = {
        "every_5m": {"task": "proj.tick", "schedule": 300.0, "options": {"expires": 60}},
        "noon": {"task": "proj.noon", "schedule": crontab(minute=0, hour=12)},
    }
    path = str(tmp_path / "celerybeat-schedule")
    sched = beat.PersistentScheduler(app, schedule_filename=path, lazy=False)
    ran = datetime(2025, 5, 1, 3, 2, 1, tzinfo=UTC)
    sched.schedule["every_5m"].last_run_at = ran
    sched.schedule["every_5m"].total_run_count = 7
    sched.sync()
    sched.close()

    source = ScheduleFileSource(path)
    items = by_name(source.read())
    assert items["every_5m"].options["delayq_anchor"] == ran
    assert items["every_5m"].history["total_run_count"] == 7
    assert items["every_5m"].options["expires"] == 60
    assert items["noon"].options["delayq_tz"] == "Asia/Tokyo"  # the file's tz
    plan = imports.plan(source, store)
    assert {s.name: s.action for s in plan.steps} == {
        "celery.backend_cleanup": "create", "every_5m": "create", "noon": "create"}
    imports.apply(plan, store)
    assert {e.name for e in store.entries()} == {"celery.backend_cleanup", "every_5m", "noon"}
    runner = CliRunner()
    refused = runner.invoke(main, ["-d", store.db.url, "beat", "import", "--from", path,
                                   "--disable-source"])
    assert refused.exit_code == 1
    assert "configuration delayq cannot disable" in " ".join(refused.output.split())


def test_app_beat_schedule(store: BeatStore) -> None:
    import _beat_import_app as module

    source = AppSource("_beat_import_app:app")
    items = by_name(source.read())
    assert set(items) == set(module.app.conf.beat_schedule)
    assert not [i for i in items.values() if not hasattr(i, "task")]  # none refused
    assert items["hourly"].options == {"headers": {"team": "ops"}, "routing_key": "rk",
                                       "exchange": "ex", "delayq_tz": "Europe/Paris"}
    assert items["every_30s"].options["delayq_anchor"] == "first_install"
    assert items["week"].schedule == Interval(7 * 86400.0)
    imports.apply(imports.plan(source, store), store)
    assert len(store.entries()) == 4
    module.app.conf.beat_schedule = {**module.app.conf.beat_schedule, **module.REFUSED}
    try:
        refused = {s.name: s.reason for s in imports.plan(source, store).refused}
    finally:
        for name in module.REFUSED:
            module.app.conf.beat_schedule.pop(name)
    assert "relative=True" in refused["relative"]
    assert "countdown are not carried" in refused["countdown_option"]
