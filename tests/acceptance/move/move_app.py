"""The Celery app of ``test_move_from.py``: the same tasks first on Redis or RabbitMQ, then on
delayq after ``delayq move-from``.

``MOVE_BROKER_URL`` picks the broker, ``DELAYQ_RESULTS_URL`` the table that records
executions. Queues ``dqmove.celery`` (the default) and ``dqmove.reports`` (``move_app.report``
is routed there) are named so that no other test uses them.
"""

from __future__ import annotations

import json
import os

import psycopg
from celery import Celery
from kombu import Exchange, Queue

import delayq_transport  # noqa: F401  (registers delayq+postgresql://)

PREFIX = "dqmove."
DEFAULT, REPORTS = f"{PREFIX}celery", f"{PREFIX}reports"


def configure(app: Celery, broker_url: str, protocol: int = 2) -> Celery:
    """The routing every process of the test shares (workers, producers of either protocol)."""
    app.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        task_default_queue=DEFAULT,
        task_queues=[Queue(DEFAULT, Exchange(DEFAULT), routing_key=DEFAULT),
                     Queue(REPORTS, Exchange(REPORTS), routing_key=REPORTS)],
        task_routes={"move_app.report": {"queue": REPORTS}},
        task_protocol=protocol,
        worker_prefetch_multiplier=50,  # a worker takes every countdown it can hold
        worker_hijack_root_logger=False,
        enable_utc=True,
        timezone="UTC",
    )
    return app


app = configure(Celery("move_app"), os.environ.get("MOVE_BROKER_URL", "redis://127.0.0.1/9"))


def record(task_id: str, name: str, arg: object, eta: str | None = None) -> None:
    with psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True) as conn:
        conn.execute("INSERT INTO executions (task_id, name, arg, pid, redelivered, eta)"
                     " VALUES (%s, %s, %s, %s, false, %s)",
                     (task_id, name, json.dumps(arg), os.getpid(), eta))


@app.task(bind=True, name="move_app.mark")
def mark(self, arg: object = None) -> object:
    record(self.request.id, "mark", arg, self.request.eta)
    return arg


@app.task(bind=True, name="move_app.report")
def report(self, arg: object = None) -> object:
    record(self.request.id, "report", arg, self.request.eta)
    return arg


@app.task(bind=True, name="move_app.flaky", max_retries=3)
def flaky(self, arg: object = None) -> object:
    """Runs once, then retries a day later (the same task id, ``retries`` 1)."""
    record(self.request.id, f"flaky-try-{self.request.retries}", arg)
    if self.request.retries < 1:
        raise self.retry(countdown=86_400)
    return arg
