"""The Celery app that ``bench_celery.py``'s worker and producer processes load.

One module for every broker, configured from the environment, so the only thing that differs
between the brokers compared is ``broker_url`` (and, for the kill phase, the broker's own
redelivery option):

- ``BENCH_BROKER_URL``: ``delayq+postgresql://...``, ``redis://...``, ``amqp://...``, ``sqla+...``;
- ``BENCH_TRANSPORT_OPTIONS``: JSON for ``broker_transport_options``;
- ``BENCH_QUEUE``: the queue (a fresh name per phase, so a shared RabbitMQ is never touched);
- ``BENCH_COUNTER_URL``: the Redis database the tasks report to. Every broker's tasks pay the
  same one Redis round trip, so the report costs the same whatever the broker;
- ``BENCH_PREFETCH`` (worker_prefetch_multiplier), ``BENCH_ACKS_LATE`` ("1" for acks_late).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_ready

import delayq_transport  # (registers delayq+; imported for every broker alike)

#: A variant of bench/_variants.py (delayq@REV) must run that revision's delayq, not this one.
_ROOT = os.environ.get("BENCH_DELAYQ_ROOT")
_WHERE = os.path.dirname(os.path.dirname(os.path.realpath(delayq_transport.__file__)))
if _ROOT is not None and _WHERE != os.path.realpath(_ROOT):
    raise RuntimeError(f"BENCH_DELAYQ_ROOT is {_ROOT}, but delayq comes from {_WHERE}")

app = Celery("delayq_bench")


def configure() -> None:
    """(Re)read the environment: producer processes import this module before they set it."""
    global _counter
    _counter = None
    app.conf.update(
        broker_url=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/11"),
        broker_transport_options=json.loads(os.environ.get("BENCH_TRANSPORT_OPTIONS", "{}")),
        broker_connection_retry_on_startup=True,
        task_default_queue=os.environ.get("BENCH_QUEUE", "bench_celery"),
        worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
        task_acks_late=os.environ.get("BENCH_ACKS_LATE") == "1",
        task_ignore_result=True,
        enable_utc=True,
        timezone="UTC",
    )


_counter: redis.Redis | None = None
#: Logged at WARNING when the worker consumes: workers run at --loglevel=WARNING, because
#: INFO's two lines per task would cost every broker more than the broker itself does.
READY_LINE = "bench: worker ready"


@worker_ready.connect
def _announce_ready(**_: Any) -> None:
    logging.getLogger("bench").warning(READY_LINE)


configure()


def counter() -> redis.Redis:
    """One client per process (redis-py re-creates its pool after a fork by itself)."""
    global _counter
    if _counter is None:
        _counter = redis.Redis.from_url(os.environ.get("BENCH_COUNTER_URL",
                                                       "redis://127.0.0.1:6379/12"))
    return _counter


@app.task(name="bench.noop", ignore_result=True)
def noop(key: str, total: int) -> None:
    """Count one execution; the one that reaches ``total`` stamps the finish time."""
    if counter().incr(key) >= total:
        counter().set(f"{key}:done", repr(time.time()), nx=True)


@app.task(name="bench.lag", ignore_result=True)
def lag(key: str, reference: float) -> None:
    """Record how late this run is against ``reference`` (send time, or the ETA)."""
    counter().rpush(key, repr(time.time() - reference))


@app.task(name="bench.hour", ignore_result=True)
def hour() -> None:
    """The one-hour countdown of the memory phase; never due while the bench runs."""


@app.task(name="bench.sleepy", bind=True, ignore_result=True)
def sleepy(self: Any, key: str, seconds: float) -> None:
    """Report the start (who, redelivered?), then run long enough to be killed mid-way."""
    info = self.request.delivery_info or {}
    counter().rpush(key, json.dumps({
        "at": time.time(),
        "hostname": self.request.hostname,
        "redelivered": bool(info.get("redelivered")),
    }))
    time.sleep(seconds)


if __name__ == "__main__":  # a module bench_celery.py's processes load, not a script
    print(__doc__)
