"""The Celery app real worker/beat subprocesses load in acceptance tests.

Configured from the environment so each test points it at its own fresh database:
``DELAYQ_BROKER_URL`` (delayq+postgresql://...), ``DELAYQ_RESULTS_URL`` (plain postgresql URL
of the table that records executions), ``DELAYQ_TRANSPORT_OPTIONS`` (JSON).
"""

from __future__ import annotations

import json
import os
import time

import psycopg
from celery import Celery

import delayq_transport  # noqa: F401  (registers the delayq+ scheme: the one extra step)

app = Celery("acceptance")
app.conf.update(
    broker_url=os.environ.get("DELAYQ_BROKER_URL", "delayq+postgresql://postgres@127.0.0.1/test"),
    broker_transport_options=json.loads(os.environ.get("DELAYQ_TRANSPORT_OPTIONS", "{}")),
    broker_connection_retry_on_startup=True,
    task_default_queue="celery",
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=int(os.environ.get("DELAYQ_PREFETCH", "4")),
    timezone=os.environ.get("DELAYQ_TZ", "UTC"),
    enable_utc=True,
    task_acks_late=os.environ.get("DELAYQ_ACKS_LATE") == "1",
)

RESULTS_DDL = """CREATE TABLE IF NOT EXISTS executions (
    id BIGSERIAL PRIMARY KEY, task_id TEXT, name TEXT, arg TEXT, pid INT,
    redelivered BOOLEAN, eta TEXT, ran_at TIMESTAMPTZ DEFAULT clock_timestamp())"""


def record(task_id: str, name: str, arg: object, redelivered: bool = False,
           eta: str | None = None) -> None:
    with psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, name, arg, pid, redelivered, eta)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (task_id, name, json.dumps(arg), os.getpid(), redelivered, eta),
        )


@app.task(bind=True, name="celery_app.mark")
def mark(self, arg: object = None) -> object:
    """Record one execution (with its redelivery flag and ETA)."""
    info = self.request.delivery_info or {}
    record(self.request.id, "mark", arg, bool(info.get("redelivered")), self.request.eta)
    return arg


@app.task(bind=True, name="celery_app.sleepy")
def sleepy(self, seconds: float, arg: object = None) -> object:
    """Run long (to test lease extension / kills), then record."""
    time.sleep(seconds)
    info = self.request.delivery_info or {}
    record(self.request.id, "sleepy", arg, bool(info.get("redelivered")), self.request.eta)
    return arg


@app.task(bind=True, max_retries=3, name="celery_app.flaky")
def flaky(self, arg: object = None, fail_times: int = 1, countdown: float = 1.0) -> object:
    """Fail ``fail_times`` times with Task.retry(countdown=...), then record."""
    record(self.request.id, f"flaky-try-{self.request.retries}", arg)
    if self.request.retries < fail_times:
        raise self.retry(countdown=countdown)
    record(self.request.id, "flaky", arg)
    return arg


@app.task(name="celery_app.noop")
def noop() -> None:
    return None
