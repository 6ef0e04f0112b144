"""The Dramatiq app of every Dramatiq system: ``BENCH_BROKER`` picks the broker.

``delayq`` (delayq's broker), ``redis``, ``rabbitmq``, ``postgres`` (dramatiq-postgres),
``stub`` (Dramatiq's in-memory StubBroker: the producer runs in the worker process);
``BENCH_URL`` its URL, ``BENCH_OPTIONS`` (JSON) keyword arguments of its class, ``BENCH_QUEUE``.
Tasks and producers: apps/report.py.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import dramatiq
import report
from dramatiq.middleware import Middleware

KIND = os.environ.get("BENCH_BROKER", "stub")
URL = os.environ.get("BENCH_URL", "")
QUEUE = os.environ.get("BENCH_QUEUE", "bench")
OPTIONS = json.loads(os.environ.get("BENCH_OPTIONS", "{}"))


def _broker() -> dramatiq.Broker:
    if KIND == "delayq":
        from delayq_transport.dramatiq import DelayqBroker

        return DelayqBroker(url=URL, **OPTIONS)
    if KIND == "postgres":
        from dramatiq_postgres import PostgresBroker

        return PostgresBroker(url=URL, results=False, **OPTIONS)
    if KIND == "redis":
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=URL, **OPTIONS)
    if KIND == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=URL, **OPTIONS)
    from dramatiq.brokers.stub import StubBroker

    return StubBroker(**OPTIONS)


class Sender:
    def send(self, name: str, args: tuple[Any, ...], delay_s: float) -> None:
        ACTORS[name].send_with_options(args=args, delay=math.ceil(delay_s * 1000) or None)

    def close(self) -> None:
        """Dramatiq's brokers are shared by the process' threads; closed at exit."""


class _InProcess(Middleware):
    def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        report.serve_in_process(Sender)


broker = _broker()
broker.add_middleware(_InProcess())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="noop")
def noop(key: str, total: int) -> None:
    report.count(key, total)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="timed")
def timed(key: str, ident: int, due: float) -> None:
    report.timed(key, ident, due)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, actor_name="sleepy")
def sleepy(key: str, ident: int, seconds: float) -> None:
    report.sleepy(key, ident, seconds)


ACTORS = {"noop": noop, "timed": timed, "sleepy": sleepy}


def produce_main() -> None:
    try:
        report.main(Sender)
    finally:
        broker.close()
