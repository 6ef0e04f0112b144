"""A Celery app whose periodic tasks are installed ahead of time by delayq_beat.

Run (after ``delayq migrate -d postgresql://postgres@127.0.0.1:5432/test``)::

    celery -A beat_app worker -l INFO            # from the examples/ directory
    celery -A beat_app beat -S delayq_beat.Scheduler -l INFO   # any number of these
    delayq -d postgresql://postgres@127.0.0.1:5432/test beat list

``-S delayq`` works too (the ``celery.beat_schedulers`` entry point of the delayq package).
"""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

import delayq_beat  # noqa: F401  (registers the beat tables' migration)
import delayq_transport.transport  # noqa: F401  (registers the delayq+postgresql:// broker URL)

app = Celery("beat_app")
app.conf.update(
    broker_url=os.environ.get("DELAYQ_BROKER_URL",
                              "delayq+postgresql://postgres@127.0.0.1:5432/test"),
    timezone="America/New_York",
    delayq_beat_refresh_interval=30,          # seconds between refreshes
    delayq_beat_horizon=timedelta(hours=1),   # how far ahead occurrences are installed
    beat_schedule={
        "heartbeat": {"task": "beat_app.heartbeat", "schedule": 10.0},
        "nightly_report": {
            "task": "beat_app.report",
            "schedule": crontab(hour=2, minute=30),  # 03:30 on the spring-forward day
            "args": ("daily",),
            "options": {"queue": "reports", "expires": 3600,
                        "delayq_misfire": "skip", "delayq_grace": 600},
        },
        "hourly_sync": {
            "task": "beat_app.report",
            "schedule": crontab(minute=0),  # both 01:00s on the fall-back day
            "args": ("hourly",),
            "options": {"delayq_misfire": "run_all"},
        },
    },
)


@app.task(name="beat_app.heartbeat")
def heartbeat() -> str:
    return "alive"


@app.task(name="beat_app.report")
def report(kind: str) -> str:
    return f"{kind} report done"
