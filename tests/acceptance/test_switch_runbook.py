"""The switch and rollback runbook (docs/how-to/switch-celery.md), end to end, as a Django team
on Celery + Redis + django-celery-beat + django-celery-results runs it (issue 36, item 6).

The test Django project starts on Redis (DB 8) with django-celery-beat's scheduler and a worker;
it has an interval schedule (every 3 s), a crontab at 09:00 New York and a clocked one-off.
Countdown tasks wait in Redis, two due within the test and one in two days. Then the runbook's
steps, each the command it names: ``delayq migrate``, stop the old beat, ``delayq beat import
--from django-celery-beat --disable-source`` (after its ``--dry-run``), start delayq's worker
and beat, stop the old worker, ``delayq move-from redis://...``.

After the switch: every occurrence of the interval runs on time exactly once, the one-off once,
the crontab is installed at 09:00 New York; each countdown runs at its ETA once and the long
one waits in delayq at its ETA. Rollback: stop delayq's processes, ``delayq beat import ...
--undo``: no delayq entry, ledger row or installed occurrence is left, the old entries are
enabled again (not the one-off, which ran), and the old setup runs the schedule again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
import redis

from .conftest import CeleryProcess, wait_until
from .test_django import PROJECT, ROOT, manage

REDIS_URL = "redis://127.0.0.1:6379/8"  # a database number no other test uses
EVERY_S = 3
NY = ZoneInfo("America/New_York")


@pytest.fixture
def envs(database_url: str) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """The project's environment before (Redis, django-celery-beat's scheduler) and after the
    switch (delayq from DATABASES, delayq's scheduler)."""
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    base = dict(os.environ)
    base.update(DJANGO_DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="djproject.settings",
                DJANGO_BEAT_APPS="1", DELAYQ_TRANSPORT_OPTIONS=json.dumps(
                    {"acquire_timeout": 10, "polling_interval": 1}),
                PYTHONPATH=os.pathsep.join([str(ROOT), str(PROJECT),
                                            base.get("PYTHONPATH", "")]))
    old = dict(base, DJANGO_BROKER_URL=REDIS_URL,
               DJANGO_BEAT_SCHEDULER="django_celery_beat.schedulers:DatabaseScheduler")
    new = dict(base, DJANGO_BEAT_SCHEDULER="delayq_beat.Scheduler", DJANGO_BEAT_REFRESH="1")
    manage(old, "migrate", "--no-input")
    yield old, new
    client.flushdb()
    client.close()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    started: list[CeleryProcess] = []

    def run(env: dict[str, str], *args: str, ready: str, name: str) -> CeleryProcess:
        proc = CeleryProcess(["-A", "djproject", *args], env, tmp_path / f"{name}.log")
        started.append(proc)
        proc.wait_for_log(ready, timeout=60)
        return proc

    yield run
    for proc in started:
        proc.stop()


def worker(start: Any, env: dict[str, str], name: str) -> CeleryProcess:
    return start(env, "worker", "-P", "solo", "-l", "INFO", "-n", f"{name}-{os.getpid()}@%h",
                 ready="ready.", name=name)


def beat(start: Any, env: dict[str, str], scheduler: str, name: str,
         tmp: Path) -> CeleryProcess:
    return start(env, "beat", "-S", scheduler, "-l", "INFO", "-s", str(tmp / f"{name}.db"),
                 ready="beat: Starting...", name=name)


def delayq(url: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", "from delayq_transport.cli import main; main()",
                           "-d", url, *args],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COLUMNS="200"))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def ticks(url: str) -> list[tuple[str, str, int | None, datetime]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT label, task_id, at_ms, ran FROM shop_tick ORDER BY id").fetchall()


def receipts(url: str) -> dict[str, list[datetime]]:
    out: dict[str, list[datetime]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for task_id, ran in conn.execute("SELECT task_id, ran FROM shop_receipt"):
            out.setdefault(task_id, []).append(ran)
    return out


def one(url: str, query: str, *params: Any) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params).fetchone()


@pytest.mark.alone  # its 28-s countdown must outlast the steps before the old worker stops
def test_switch_then_rollback(envs: tuple[dict[str, str], dict[str, str]], start: Any,
                              database_url: str, tmp_path: Path) -> None:
    old, new = envs
    url = database_url
    manage(old, "shell", "-c", f"""
import datetime as dt
from django.utils import timezone
from django_celery_beat.models import *
i = IntervalSchedule.objects.create(every={EVERY_S}, period='seconds')
PeriodicTask.objects.create(name='pulse', task='shop.tasks.tick', interval=i, args='["pulse"]')
c = CrontabSchedule.objects.create(minute='0', hour='9', timezone='America/New_York')
PeriodicTask.objects.create(name='nine', task='shop.tasks.tick', crontab=c, args='["nine"]')
k = ClockedSchedule.objects.create(clocked_time=timezone.now() + dt.timedelta(seconds=45))
PeriodicTask.objects.create(name='once', task='shop.tasks.tick', clocked=k, one_off=True,
                            args='["once"]')
""")
    # -- before: the old setup runs ------------------------------------------------------------
    old_worker = worker(start, old, "old-worker")
    old_beat = beat(start, old, "django_celery_beat.schedulers:DatabaseScheduler", "old-beat",
                    tmp_path)
    wait_until(lambda: len(ticks(url)) >= 2, timeout=30, message="pulses on Redis")
    # Each ETA as published: the message's own `eta` header (Celery turns the countdown into it
    # at publish time), not a clock read after the publishing process exited, which on a busy
    # machine is late by however long that exit took.
    published = json.loads(manage(old, "shell", "-c", """
import json
from datetime import datetime
from celery.signals import before_task_publish
from shop.tasks import send_receipt
etas = {}
before_task_publish.connect(lambda headers, **_: etas.__setitem__(
    headers["id"], datetime.fromisoformat(headers["eta"]).timestamp()), weak=False)
out = {}
for n, countdown in ((1, 28), (2, 32), (3, 2 * 86400)):
    r = send_receipt.apply_async((9000 + n,), countdown=countdown)
    out[r.id] = [countdown, etas[r.id]]
print(json.dumps(out))
""").strip().splitlines()[-1])
    etas = {task_id: eta for task_id, (_, eta) in published.items()}

    # -- the switch ----------------------------------------------------------------------------
    delayq(url, "migrate")
    old_beat.stop()
    old_beat_stopped = datetime.now(UTC)
    plan = delayq(url, "beat", "import", "--from", "django-celery-beat", "--dry-run",
                  "--disable-source")
    # django-celery-beat's scheduler stored Celery's own celery.backend_cleanup entry too
    assert ("dry run: 4 create; to disable in django-celery-beat: celery.backend_cleanup, "
            "nine, once, pulse") in plan
    delayq(url, "beat", "import", "--from", "django-celery-beat", "--disable-source")
    worker(start, new, "new-worker")
    new_beat = beat(start, new, "delayq_beat.Scheduler", "new-beat", tmp_path)
    old_worker.stop()  # warm shutdown: the ETA tasks it held go back to Redis
    moved = delayq(url, "move-from", REDIS_URL, "--json")
    switched = time.time()
    assert one(url, 'SELECT count(*) FROM delayed_queue WHERE "pKey" = ANY(%s)',
               list(published))[0] == 3, moved

    # -- verify ----------------------------------------------------------------------------------
    short = [t for t, (c, _) in published.items() if c < 3600]
    wait_until(lambda: all(t in receipts(url) for t in short), timeout=60,
               message="the countdowns moved into delayq ran")
    wait_until(lambda: any(t[0] == "once" for t in ticks(url)), timeout=60,
               message="the one-off")
    time.sleep(EVERY_S)
    done = receipts(url)
    for task_id in short:  # once each, at its ETA (the database stamps `ran`), never before it
        assert len(done[task_id]) == 1
        after = done[task_id][0].timestamp() - etas[task_id]  # -2 ms: the ETA kept in ms
        assert -0.002 <= after <= 3.0, f"{task_id} ran {after:.3f} s after its ETA"
    long_id = next(t for t, (c, _) in published.items() if c > 3600)
    at_ms = one(url, 'SELECT "scheduledAt" FROM delayed_queue WHERE "pKey" = %s', long_id)[0]
    assert abs(at_ms / 1000 - etas[long_id]) < 1.5  # waits in delayq at its ETA
    runs = ticks(url)
    assert not [t for t in runs if t[2] is None and t[3] > old_beat_stopped
                + timedelta(seconds=2)]  # nothing from the old beat after it stopped
    ours = sorted(t[2] for t in runs if t[0] == "pulse" and t[2] is not None)
    assert len(ours) == len(set(ours)) >= 3  # each occurrence once
    assert all(b - a == EVERY_S * 1000 for a, b in zip(ours, ours[1:], strict=False))
    assert ours[0] <= (switched + EVERY_S + 2) * 1000  # none missing since the switch
    late = [(t[3].timestamp() * 1000 - t[2]) for t in runs if t[2] is not None]
    assert max(late) < 2500  # on time
    assert [t[0] for t in runs].count("once") == 1
    nine = one(url, 'SELECT min("scheduledAt") FROM delayed_queue WHERE "pKey" LIKE %s',
               "nine/%")[0]
    assert datetime.fromtimestamp(nine / 1000, NY).strftime("%H:%M") == "09:00"

    # -- rollback --------------------------------------------------------------------------------
    new_beat.stop()
    undo = delayq(url, "beat", "import", "--from", "django-celery-beat", "--undo")
    assert "left disabled in django-celery-beat (one-offs that ran under delayq): once" in \
        " ".join(undo.split())
    assert one(url, "SELECT count(*) FROM delayq_schedule_entries")[0] == 0
    assert one(url, "SELECT count(*) FROM delayq_schedule_installed")[0] == 0
    assert one(url, 'SELECT count(*) FROM delayed_queue WHERE "pKey" <> %s', long_id)[0] == 0
    enabled = dict(one(url, "SELECT json_object_agg(name, enabled) FROM "
                            "django_celery_beat_periodictask")[0])
    assert enabled == {"pulse": True, "nine": True, "once": False,
                       "celery.backend_cleanup": True}
    rolled_back = datetime.now(UTC)
    worker(start, old, "old-worker-again")
    beat(start, old, "django_celery_beat.schedulers:DatabaseScheduler", "old-beat-again",
         tmp_path)
    wait_until(lambda: len([t for t in ticks(url) if t[2] is None and t[3] > rolled_back])
               >= 2, timeout=30, message="pulses on Redis again")
    assert [t[0] for t in ticks(url)].count("once") == 1
