"""Admin mode (``delayq_beat_source = "django-celery-beat"``) against real PostgreSQL, two
Schedulers in this process as two beats: django-celery-beat's tables (its own models) are read
at each refresh, changes are re-read only when its change mark moves, both beats install the
same occurrences once, and the worker side writes run history once per occurrence."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from _djbeat import django_database
from celery import Celery
from django_celery_beat.models import (
    ClockedSchedule,
    IntervalSchedule,
    PeriodicTask,
    PeriodicTasks,
)

from delayq_beat import RefreshReport, Scheduler
from delayq_transport import DelayedQueue
from delayq_transport.scheduling.djbeat import record_runs


@pytest.fixture
def app(database_url: str) -> Iterator[Celery]:
    with django_database(database_url):
        app = Celery("admin_t", broker="delayq+" + database_url, set_as_current=False)
        app.conf.update(delayq_beat_source="django-celery-beat", delayq_beat_check_tasks=False,
                        delayq_beat_refresh_interval=5, delayq_beat_horizon=60,
                        result_expires=None)  # no celery.backend_cleanup entry
        yield app


@pytest.fixture
def beats(app: Celery) -> Iterator[tuple[Scheduler, Scheduler]]:
    pair = (Scheduler(app), Scheduler(app))
    yield pair
    for sched in pair:
        sched.close()


def rows(url: str) -> list[tuple[str, bytes]]:
    with psycopg.connect(url) as conn:
        return conn.execute('SELECT "pKey", payload FROM delayed_queue ORDER BY "pKey"').fetchall()


def entries(url: str) -> set[str]:
    return {key.split("/")[0] for key, _ in rows(url)}


def after_a_change(a: Scheduler, b: Scheduler) -> RefreshReport:
    """Both beats refresh after an admin change: the first to read it (``a``) installs nothing,
    since ``b`` may be in the middle of a refresh of the old configuration; ``b`` reads the
    change too and installs it, then ``a`` has nothing left to do. The change is made once."""
    first, second = a.refresh(), b.refresh()
    assert (first.in_force, second.in_force) == (False, True)
    again = a.refresh()
    assert again.in_force and not again.installed and not again.replaced
    assert not again.uninstalled
    return second


def every(seconds: int, **fields: object) -> dict:
    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    return {"interval": interval, **fields}


def test_admin_edits_reach_both_beats_once(beats: tuple[Scheduler, Scheduler],
                                           database_url: str) -> None:
    a, b = beats
    PeriodicTask.objects.create(name="pulse", task="shop.tick", args="[1]", **every(10))
    PeriodicTask.objects.create(name="report", task="shop.report", **every(30))
    PeriodicTask.objects.create(name="off", task="shop.tick", enabled=False, **every(10))
    assert sum(a.refresh().installed.values()) >= 6 + 2  # 60 s ahead
    assert sum(b.refresh().installed.values()) == 0  # the same keys: installed once
    installed = rows(database_url)
    assert entries(database_url) == {"pulse", "report"}
    message = json.loads(installed[0][1])
    assert message["headers"]["periodic_task_name"] == "pulse"
    assert message["headers"]["delayq_beat"]["source"] == "django-celery-beat"

    PeriodicTask.objects.filter(name="pulse").update(args="[2]")  # no signal: mark unmoved
    a.refresh()  # the second read after the first one's change
    a.refresh()
    assert not a.last_report.replaced and not a._source.read_rows  # type: ignore[union-attr]
    task = PeriodicTask.objects.get(name="pulse")
    task.args = "[3]"
    task.save()  # the admin's change form: a save, which moves the mark
    assert after_a_change(a, b).replaced == ["pulse"]
    assert {json.loads(p)["headers"]["argsrepr"] for k, p in rows(database_url)
            if k.startswith("pulse/")} == {"(3,)"}

    PeriodicTask.objects.filter(name="report").update(enabled=False)  # the admin's bulk action
    PeriodicTasks.update_changed()
    assert set(after_a_change(a, b).uninstalled) == {"report"}
    PeriodicTask.objects.get(name="pulse").delete()  # none left: an empty configuration
    # yields to any other alive, so it is in force once neither beat holds the old one
    reports = [b.refresh(), a.refresh(), b.refresh()]
    assert [r.in_force for r in reports] == [False, False, True]
    assert set(reports[2].uninstalled) == {"pulse"}
    assert rows(database_url) == []


def test_runs_written_back_once_and_one_off_disabled(beats: tuple[Scheduler, Scheduler],
                                                     database_url: str) -> None:
    a, b = beats
    now = datetime.now(UTC)
    PeriodicTask.objects.create(name="pulse", task="shop.tick", **every(10))
    clocked = ClockedSchedule.objects.create(clocked_time=now + timedelta(seconds=30))
    PeriodicTask.objects.create(name="once", task="shop.tick", clocked=clocked, one_off=True)
    a.refresh()
    b.refresh()
    mark = PeriodicTasks.last_change()
    installed = rows(database_url)
    delivered = [(key, json.loads(p)["headers"]["delayq_beat"]) for key, p in installed]
    pulse = [d for d in delivered if d[0].startswith("pulse/")][:2]
    once = [d for d in delivered if d[0].startswith("once/")]
    assert len(once) == 1
    with DelayedQueue(database_url) as queue:
        assert record_runs(queue, pulse) == 1
        assert PeriodicTasks.last_change() == mark  # run history alone moves no mark
        assert record_runs(queue, pulse + once) == 1
        assert record_runs(queue, pulse + once) == 0  # redelivered: nothing counted again
        assert record_runs(queue, [(k, {"source": "other"}) for k, _ in pulse]) == 0
    task = PeriodicTask.objects.get(name="pulse")
    assert task.total_run_count == 2
    assert task.last_run_at == datetime.fromtimestamp(pulse[1][1]["at_ms"] / 1000, UTC)
    assert PeriodicTasks.last_change() > mark  # the one-off was disabled
    one = PeriodicTask.objects.get(name="once")
    assert (one.enabled, one.total_run_count) == (False, 0)  # as django-celery-beat leaves it
    assert one.last_run_at == clocked.clocked_time.replace(
        microsecond=clocked.clocked_time.microsecond // 1000 * 1000)  # the occurrence's ms
    report = after_a_change(a, b)  # the mark moved (the one-off): re-read
    assert report.replaced == [] and set(report.uninstalled) == {"once"}  # pulse's anchor did
    # not move with its last run


def test_beat_list_shows_the_admins_entries_with_their_fields(app: Celery,
                                                              database_url: str) -> None:
    """What a beat in admin mode installed is listed as django-celery-beat's, with the task and
    schedule of its row (the ledger keeps neither), and beat_schedule's entries stay config."""
    from click.testing import CliRunner

    from delayq_transport.browse.beat import beat_entries
    from delayq_transport.cli import main

    app.conf.beat_schedule = {"local": {"task": "shop.local", "schedule": 60.0}}
    PeriodicTask.objects.create(name="pulse", task="shop.tick", args="[1]", **every(10))
    beat = Scheduler(app)
    try:
        beat.refresh()
    finally:
        beat.close()
    out = CliRunner().invoke(main, ["-d", database_url, "beat", "list", "--json"])
    assert out.exit_code == 0, out.output
    listed = {e["name"]: e for e in json.loads(out.stdout)["entries"]}
    assert (listed["pulse"]["origin"], listed["pulse"]["task"],
            listed["pulse"]["schedule"]) == ("django-celery-beat", "shop.tick", "every 10.0s")
    assert listed["pulse"]["enabled"] and listed["pulse"]["upcoming"]
    assert (listed["local"]["origin"], listed["local"]["task"]) == ("config", None)
    table = CliRunner().invoke(main, ["-d", database_url, "beat", "list"])
    assert table.exit_code == 0, table.output
    row = next(line for line in table.stdout.splitlines() if line.startswith("│ pulse "))
    assert "django-celery-beat" in row and "shop.tick every 10.0s" in row, table.stdout

    with DelayedQueue(database_url) as queue:  # the web page lists them alike
        page = {e["name"]: e for e in beat_entries(queue)}
    assert (page["pulse"]["origin"], page["pulse"]["task"]) == ("django-celery-beat", "shop.tick")

    PeriodicTask.objects.filter(name="pulse").update(enabled=False)  # before the next refresh
    out = CliRunner().invoke(main, ["-d", database_url, "beat", "list", "--json"])
    assert not {e["name"]: e for e in json.loads(out.stdout)["entries"]}["pulse"]["enabled"]
