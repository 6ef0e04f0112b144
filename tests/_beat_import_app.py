"""A Celery app whose ``beat_schedule`` ``delayq beat import --from _beat_import_app:app`` reads
(tests/integration/test_beat_import_celery.py)."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, schedule, solar

app = Celery("beat_import", set_as_current=False)
app.conf.timezone = "Europe/Paris"
app.conf.beat_schedule = {
    "every_30s": {"task": "proj.tick", "schedule": 30.0, "args": (1,),
                  "options": {"queue": "ticks", "priority": 5, "expires": 20}},
    "hourly": {"task": "proj.report", "schedule": crontab(minute=15), "kwargs": {"k": "v"},
               "options": {"headers": {"team": "ops"}, "routing_key": "rk", "exchange": "ex"}},
    "week": {"task": "proj.weekly", "schedule": timedelta(days=7)},
    "sunrise": {"task": "proj.lights", "schedule": solar("sunrise", 48.85, 2.35)},
}

#: Entries delayq cannot carry, each for its own reason.
REFUSED = {
    "relative": {"task": "proj.tick", "schedule": schedule(timedelta(hours=1), relative=True)},
    "countdown_option": {"task": "proj.tick", "schedule": 60.0, "options": {"countdown": 5}},
}
