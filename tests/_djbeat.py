"""django-celery-beat in the test process: Django configured once (its models, no project), the
``default`` connection pointed at a test's database (as Django's own test runner does), and
django-celery-beat's scheduler stepped on a simulated clock (what it would fire, without a
database: the model instances are never saved).

Shared by the parity unit tests and the import/admin-mode integration tests, because Django's
settings can be configured once per process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        INSTALLED_APPS=["django_celery_beat"], USE_TZ=True, TIME_ZONE="UTC",
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "postgres",
                               "HOST": "127.0.0.1", "USER": "postgres"}},
        DJANGO_CELERY_BEAT_TZ_AWARE=True)
    django.setup()

from celery import Celery  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django_celery_beat.models import PeriodicTask  # noqa: E402
from django_celery_beat.schedulers import ModelEntry  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

APP = Celery("parity", set_as_current=False)
APP.conf.timezone = "UTC"


class Clock:
    now = datetime(2025, 10, 30, 17, 0, 7, tzinfo=UTC)


class _Entry(ModelEntry):
    """django-celery-beat's entry on the simulated clock (its "now" is the app's time)."""

    def _default_now(self) -> datetime:
        return Clock.now.astimezone(self.app.timezone)


def _bind(entry: ModelEntry) -> ModelEntry:
    sched = entry.schedule
    zone = vars(sched).get("tz")  # TzAwareCrontab reads the clock in its own zone
    sched.nowfun = (lambda: Clock.now.astimezone(zone)) if zone else (lambda: Clock.now)
    return entry


def django_fires(task: PeriodicTask, start: datetime, end: datetime,
                 max_sleep_s: float = 300) -> list[datetime]:
    """What django-celery-beat's beat runs in [start, end): its scheduler asks each entry
    ``is_due()`` and sleeps the time it answers, at most its max_interval (5 s; the default
    300 s here gives the same instants wherever the answer is exact), and a run makes the next
    entry (``__next__``). The task is never saved."""
    Clock.now = start
    task.save = lambda *args, **kwargs: None  # type: ignore[method-assign]
    entry = _bind(_Entry(task, app=APP))
    fired: list[datetime] = []
    while Clock.now < end:
        due, wait_s = entry.is_due()
        if due:
            fired.append(Clock.now)
            entry = _bind(next(entry))
        else:
            Clock.now += timedelta(seconds=min(max(wait_s, 0.001), max_sleep_s))
    return fired


@contextmanager
def django_database(url: str) -> Iterator[Any]:
    """The ``default`` connection on the database at ``url`` (django-celery-beat migrated
    there), for the ORM in this process; closed afterwards."""
    params = conninfo_to_dict(url)
    conn = connections["default"]
    conn.close()
    conn.settings_dict.update(NAME=params.get("dbname"), HOST=params.get("host", ""),
                              PORT=params.get("port", ""), USER=params.get("user", ""),
                              PASSWORD=params.get("password", ""))
    call_command("migrate", "django_celery_beat", verbosity=0)
    try:
        yield conn
    finally:
        conn.close()
