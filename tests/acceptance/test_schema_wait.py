"""A ``celery worker`` started on a database without delayq's tables, whose role may not create
them (a deploy where ``delayq migrate`` runs beside the new workers): it waits, saying so every
few seconds and naming ``delayq migrate``, and consumes once the release step ran
(docs/how-to/upgrade.md#a-worker-before-delayq-migrate). The same for ``dramatiq`` and
``manage.py delayq_worker``: tests/acceptance/test_dramatiq_worker.py,
tests/djtasks/test_processes.py; a worker that gives up: test_captured_workers.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from _celery_apps import close_connections
from _pg_roles import before_migrate
from celery import Celery

from .conftest import CeleryProcess, broker_url, executions, wait_until

WAITING = "waiting for its tables: no delayq tables in database"


def test_a_worker_waits_for_delayq_migrate_then_consumes(
        start_celery: Callable[..., CeleryProcess], database_url: str) -> None:
    with before_migrate() as (owner, role, release):
        worker = start_celery("worker", "--loglevel=INFO", "-P", "solo", "-n", "w@%h",
                              env={"DELAYQ_BROKER_URL": broker_url(role)}, name="worker")
        worker.wait_for_log(WAITING, timeout=60)
        line = next(x for x in worker.log().splitlines() if WAITING in x)
        assert "WARNING" in line and "run `delayq migrate`" in line and "giving up in" in line
        wait_until(lambda: worker.log().count(WAITING) >= 2, timeout=30,
                   message="the line again, a few seconds later")
        assert "ready." not in worker.log() and worker.proc.poll() is None
        release()
        worker.wait_for_log("ready.", timeout=60)
        producer = Celery(broker=broker_url(owner))
        sent: Any = producer.send_task("celery_app.mark", args=["after migrate"])
        wait_until(lambda: executions(database_url, "mark"), message="the task ran")
        assert [r["task_id"] for r in executions(database_url, "mark")] == [sent.id]
        close_connections(producer)
        worker.stop()


def test_a_waiting_worker_stops_at_once_on_sigterm(
        start_celery: Callable[..., CeleryProcess]) -> None:
    """A deploy rolled back before its release step: the waiting worker's warm shutdown ends
    the wait (exit 0), not the 600 s of ``schema_wait``."""
    with before_migrate() as (_, role, _release):
        worker = start_celery("worker", "--loglevel=INFO", "-P", "solo", "-n", "w@%h",
                              env={"DELAYQ_BROKER_URL": broker_url(role)}, name="worker")
        worker.wait_for_log(WAITING, timeout=60)
        os.kill(worker.proc.pid, signal.SIGTERM)
        assert worker.proc.wait(timeout=15) == 0
