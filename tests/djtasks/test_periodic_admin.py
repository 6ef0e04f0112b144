"""Periodic tasks of django.tasks edited in the Django admin (issue 44): django-celery-beat's
rows of django tasks installed by the workers' schedulers (``OPTIONS["PERIODIC_SOURCE"]``,
delayq_transport/django/periodic_admin.py), as a Celery beat in admin mode installs Celery's.

Rows are written with django-celery-beat's models in this process (their saves bump its change
mark as the admin's do); two real ``manage.py delayq_worker`` processes schedule and run them.
A row that names no django task of this backend is named by the log and ``check()`` and never
installed; after an outage longer than the horizon the row's misfire policy (its ``headers``)
decides the catch-up, as for an entry of the settings (on an injected clock)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from delayq_transport.core import Database, DelayedQueue
from delayq_transport.core.queue import from_ms, to_ms
from delayq_transport.django.periodic import Scheduler
from delayq_transport.django.tasks import DelayqBackend

from .conftest import WorkerProcess, runs, sql, wait_until

REFRESH_S = 0.5
ADMIN = json.dumps({"PERIODIC_SOURCE": "admin", "PERIODIC_REFRESH": REFRESH_S})
#: How late an admin edit shows in the installed rows: one refresh, the lead under which an
#: installed occurrence is left alone (at most one interval of these rows), the reads' slack.
WITHIN_S = 15.0
KIND = "django:default:0"
DJBEAT_TABLES = ("django_celery_beat_periodictask", "django_celery_beat_intervalschedule",
                 "django_celery_beat_crontabschedule", "django_celery_beat_periodictasks")


@pytest.fixture(autouse=True)
def _no_rows(dj_url: str) -> None:
    sql(dj_url, "TRUNCATE " + ", ".join(DJBEAT_TABLES) + " CASCADE")


def every(seconds: int) -> IntervalSchedule:
    return IntervalSchedule.objects.create(every=seconds, period=IntervalSchedule.SECONDS)


def occurrence_times(ids: list[str]) -> list[int]:
    """The occurrences' instants (epoch ms) from their result ids (``<entry>/<hash>/<ms>``)."""
    return sorted(int(i.rsplit("/", 1)[1]) for i in ids)


def queued(url: str, name: str) -> int:
    return int(sql(url, 'SELECT count(*) FROM delayed_queue WHERE "pKey" LIKE %s',
                   [name + "/%"])[0][0])


def history(url: str, name: str) -> tuple[int, Any]:
    row = sql(url, "SELECT total_run_count, last_run_at FROM django_celery_beat_periodictask "
                   "WHERE name = %s", [name])[0]
    return int(row[0]), row[1]


def test_an_admin_row_runs_each_occurrence_once_with_two_schedulers(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    PeriodicTask.objects.create(name="adm-tick", task="shop.djtasks.record",
                                interval=every(1), args='["adm-tick"]')
    start_worker(DJANGO_TASKS_OPTIONS=ADMIN)
    start_worker(DJANGO_TASKS_OPTIONS=ADMIN)
    wait_until(lambda: len(runs(dj_url, "adm-tick")) >= 4, "four occurrences", timeout=60)
    ids = [result_id for _, result_id, _, _ in runs(dj_url, "adm-tick")]
    assert len(ids) == len(set(ids))  # no occurrence twice
    assert all(i.startswith("adm-tick/") for i in ids)
    times = occurrence_times(ids)
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [1000] * (len(times) - 1)
    # The run history is written back once per occurrence, as django-celery-beat's beat does.
    ran = len(ids)

    def written() -> tuple[int, Any] | None:
        count, last = history(dj_url, "adm-tick")
        return (count, last) if count >= ran else None

    _, last = wait_until(written, "the run history", timeout=30)
    assert to_ms(last) >= times[ran - 1]


def test_admin_edits_take_effect_within_a_refresh(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    row = PeriodicTask.objects.create(name="adm-edit", task="shop.djtasks.record",
                                      interval=every(1), args='["adm-edit"]')
    start_worker(DJANGO_TASKS_OPTIONS=ADMIN)
    start_worker(DJANGO_TASKS_OPTIONS=ADMIN)
    wait_until(lambda: runs(dj_url, "adm-edit"), "the first occurrence", timeout=60)
    first_hash = runs(dj_url, "adm-edit")[0][1].split("/")[1]

    row.enabled = False
    row.save()
    wait_until(lambda: queued(dj_url, "adm-edit") == 0 and not sql(
        dj_url, "SELECT 1 FROM delayq_schedule_installed WHERE name = 'adm-edit'"),
        "the disabled row's occurrences and ledger removed", timeout=WITHIN_S)

    row.enabled = True
    row.interval = every(2)
    row.save()

    def new_runs() -> list[str]:
        return [i for _, i, _, _ in runs(dj_url, "adm-edit") if i.split("/")[1] != first_hash]

    wait_until(lambda: len(new_runs()) >= 3, "three runs of the changed row", timeout=60)
    times = occurrence_times(new_runs())
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [2000] * (len(times) - 1)
    ids = [i for _, i, _, _ in runs(dj_url, "adm-edit")]
    assert len(ids) == len(set(ids))


def test_rows_that_name_no_django_task_are_reported_and_not_installed(
        dj_url: str, caplog: pytest.LogCaptureFixture) -> None:
    tick = every(5)
    PeriodicTask.objects.create(name="good", task="shop.djtasks.record", interval=tick,
                                args='["good"]', queue="mail", priority=3)
    PeriodicTask.objects.create(name="celery", task="shop.tasks.tick", interval=tick,
                                args='["celery"]')
    PeriodicTask.objects.create(name="missing", task="shop.djtasks.nope", interval=tick)
    PeriodicTask.objects.create(name="routed", task="shop.djtasks.record", interval=tick,
                                args='["routed"]', exchange="celery")
    PeriodicTask.objects.create(name="off", task="shop.tasks.tick", interval=tick,
                                enabled=False)
    backend = DelayqBackend("default", {"QUEUES": ["default", "mail"],
                                        "OPTIONS": {"PERIODIC_SOURCE": "admin"}})
    messages = [m for m in backend.check() if m.id in ("delayq.W005", "delayq.W006",
                                                          "delayq.W007")]
    reported = sorted((m.id, m.msg.split("periodic task ")[1].split(" ")[0]) for m in messages)
    assert reported == [("delayq.W006", "'celery'"), ("delayq.W006", "'missing'"),
                        ("delayq.W007", "'routed'")], [m.msg for m in messages]
    db = Database(dj_url, min_size=0, max_size=2)
    try:
        queue = DelayedQueue(db, kind=KIND)
        scheduler = Scheduler(db, queue, {}, source="admin")
        with caplog.at_level(logging.WARNING, logger="delayq_transport.django.periodic"):
            report = scheduler.refresh()
            scheduler.refresh()  # reported once per change, not at every refresh
    finally:
        db.close()
    assert list(report.errors) == ["routed"] and "exchange 'celery'" in report.errors["routed"]
    skipped = [r.getMessage() for r in caplog.records if "is not installed" in r.getMessage()]
    assert len(skipped) == 2, skipped
    assert any("'celery'" in m and "not a django.tasks task" in m for m in skipped)
    assert any("'missing'" in m and "cannot be imported" in m for m in skipped)
    installed = sql(dj_url, 'SELECT DISTINCT split_part("pKey", \'/\', 1), "pKind" '
                            "FROM delayed_queue")
    assert installed == [("good", "django:mail:3")]


T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
#: The schedulers are down from T0 (horizon: ten minutes) to here.
RESTART = T0 + 30 * MINUTE + timedelta(seconds=30)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clocked_queue(dj_url: str) -> Iterator[tuple[DelayedQueue, Clock]]:
    clock = Clock(T0)
    db = Database(dj_url, min_size=0, max_size=2)
    queue = DelayedQueue(db, kind=KIND)
    queue.clock = clock
    yield queue, clock
    db.close()


def due(url: str, now: datetime) -> list[datetime]:
    return [from_ms(at) for at, in sql(
        url, 'SELECT "scheduledAtInitially" FROM delayed_queue WHERE "pKind" = %s AND '
             '"scheduledAt" <= %s ORDER BY 1', [KIND, to_ms(now)])]


@pytest.mark.parametrize("policy,ran", [
    ("coalesce", [30]),                 # one run for the whole gap: its newest occurrence
    ("skip", []),                       # every gap occurrence is more than grace late
    ("run_all", list(range(11, 31))),   # all twenty, late
])
def test_the_rows_misfire_policy_decides_the_catch_up_after_an_outage(
        dj_url: str, clocked_queue: tuple[DelayedQueue, Clock], policy: str,
        ran: list[int]) -> None:
    queue, clock = clocked_queue
    PeriodicTask.objects.create(
        name="adm-cron", task="shop.djtasks.record", args='["adm-cron"]',
        crontab=CrontabSchedule.objects.create(minute="*", hour="*", timezone="UTC"),
        headers=json.dumps({"delayq_misfire": policy, "delayq_grace": 10}))

    def scheduler() -> Scheduler:
        return Scheduler(queue.db, queue, {}, source="admin", refresh_interval=60, horizon=600)

    assert not scheduler().refresh().errors
    installed = sql(dj_url, 'SELECT max("scheduledAtInitially") FROM delayed_queue')[0][0]
    assert from_ms(installed) == T0 + 10 * MINUTE  # the horizon the outage outlasts
    clock.now = RESTART
    # The workers stayed up: what fell due ran.
    sql(dj_url, 'DELETE FROM delayed_queue WHERE "scheduledAt" <= %s', [to_ms(RESTART)])
    restarted = scheduler()
    restarted.refresh()
    expected = [T0 + i * MINUTE for i in ran]
    assert due(dj_url, RESTART) == expected
    assert restarted.installer.caught_up == {"adm-cron": expected}
