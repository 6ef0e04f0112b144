"""The Celery app of the topology tests' worker and beat processes: the acceptance app (its
``mark`` task records every execution in ``DELAYQ_RESULTS_URL``) plus ``topology.note``,
which records the same row over a connection it keeps (``mark`` connects per run, which held
a solo worker to ~45 tasks/s, too slow to keep up with a producer under load), and a beat
schedule from the environment. Broker URL and transport options come from the environment
as in tests/acceptance/celery_app.py."""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg
from celery_app import app  # tests/acceptance/celery_app.py

app.conf.beat_schedule = json.loads(os.environ.get("BEAT_SCHEDULE", "{}"))
app.conf.delayq_beat_refresh_interval = float(os.environ.get("BEAT_REFRESH", "2"))
app.conf.delayq_beat_horizon = float(os.environ.get("BEAT_HORIZON", "30"))

_results: list[psycopg.Connection[Any]] = []


@app.task(bind=True, name="topology.note")
def note(self: Any, arg: object = None) -> object:
    """One row per execution, as ``mark`` writes it, on this process' kept connection."""
    if not _results or _results[0].closed:
        _results[:] = [psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True)]
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    _results[0].execute(
        "INSERT INTO executions (task_id, name, arg, pid, redelivered) VALUES (%s, %s, %s, %s, %s)",
        (self.request.id, "note", json.dumps(arg), os.getpid(), redelivered))
    return arg


@app.task(name="topology.relay")
def relay(arg: object = None) -> object:
    """Publish a ``note`` from inside a task: a pool child that publishes opens connections
    of its own (the connection budget counts them)."""
    note.delay(arg)
    return arg
