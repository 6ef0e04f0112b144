"""The Celery app of every Celery system: only the environment differs between brokers.

``BENCH_BROKER_URL`` (``delayq+postgresql://``, ``redis://``, ``amqp://``, ``memory://``),
``BENCH_TRANSPORT_OPTIONS`` (JSON), ``BENCH_QUEUE``, ``BENCH_ACKS_LATE`` (``1``: acks_late),
``BENCH_PREFETCH`` (worker_prefetch_multiplier, 4). Tasks and producers: apps/report.py.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import report
from celery import Celery
from celery.signals import worker_ready

import delayq_transport  # noqa: F401 - registers delayq+ (imported for every broker alike)

app = Celery("bench")
app.conf.update(
    broker_url=os.environ.get("BENCH_BROKER_URL", "memory://"),
    broker_transport_options=json.loads(os.environ.get("BENCH_TRANSPORT_OPTIONS", "{}")),
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    task_acks_late=os.environ.get("BENCH_ACKS_LATE") == "1",
    task_ignore_result=True,
    enable_utc=True,
)


@app.task(name="noop", ignore_result=True)
def noop(key: str, total: int) -> None:
    report.count(key, total)


@app.task(name="timed", ignore_result=True)
def timed(key: str, ident: int, due: float) -> None:
    report.timed(key, ident, due)


@app.task(name="sleepy", ignore_result=True)
def sleepy(key: str, ident: int, seconds: float) -> None:
    report.sleepy(key, ident, seconds)


class Sender:
    """One producer held for the whole plan (as an application's request thread would)."""

    def __init__(self) -> None:
        self._held = app.producer_or_acquire()
        self.producer = self._held.__enter__()
        self.producer.connection.ensure_connection(max_retries=5)

    def send(self, name: str, args: tuple[Any, ...], delay_s: float) -> None:
        app.tasks[name].apply_async(args, countdown=delay_s or None, producer=self.producer)

    def close(self) -> None:
        self._held.__exit__(None, None, None)


@worker_ready.connect
def _ready(**_: Any) -> None:
    logging.getLogger("bench").warning("bench: worker ready")
    report.serve_in_process(Sender)


def produce_main() -> None:
    report.main(Sender)
