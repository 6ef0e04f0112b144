"""The dead-letter policy (formats/deadletters.py) under a real ``celery worker``: a message it
rejects (an unregistered task) is kept as a dead letter, listed by ``delayq tasks dead-letters``
and the metrics beside the other front ends', and deleted when its retention ends by the
worker's own expiry, which touches nothing else. Dramatiq's and django.tasks' workers:
tests/acceptance/test_dramatiq_worker.py, tests/djtasks/test_worker.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from _dead_letters import bystanders, listed

from delayq_transport.core.queue import DelayedQueue
from delayq_transport.metrics.collector import render

from .conftest import CeleryProcess, wait_until


def test_a_rejected_message_is_listed_then_expired_by_the_worker(
        start_worker: Callable[..., CeleryProcess], producer: Any, database_url: str) -> None:
    left = bystanders(database_url)
    # 15 s: the listing and the metrics (a process each) see the letter before the worker's
    # expiry (as often as the retention) deletes it, on a loaded machine too.
    options = {"acquire_timeout": 10, "polling_interval": 2, "dead_letter_retention": 15}
    worker = start_worker(env={"DELAYQ_TRANSPORT_OPTIONS": json.dumps(options)})
    sent = producer.send_task("celery_app.not_registered", args=[1])
    [letter] = wait_until(lambda: listed(database_url, "celery"), message="a dead letter")
    assert (letter["queue"], letter["kind"], letter["actor"], letter["message_id"]) == (
        "celery", "celery.XQ", "celery_app.not_registered", sent.id)
    with DelayedQueue(database_url, ensure_schema=False) as queue:
        assert ('delayq_dead_letters{front_end="celery",queue="celery",table="delayed_queue"} '
                '1.0') in render(queue).decode()
    wait_until(lambda: not listed(database_url, "celery"), timeout=90,
               message="the dead letter expired")
    assert left() == [("bystander", "due-now"), ("dramatiq:kept.XQ", "kept-a-day")]
    assert "kept as a dead letter for 15 s" in worker.log()
