"""How many messages one poll hands a worker that has a backlog (issue 11).

Refilling the prefetch window one or two slots at a time cost a poll (a round trip, the
acquire statement and a thread hop) per two tasks; under a backlog the worker now waits until
half its window is free. Every poll leases its rows under a lock of
its own, so the tasks (acks_late: their row is still leased while they run) tell how many
polls there were.
"""

from __future__ import annotations

import json

import pytest

from .celery_app import tagged
from .conftest import executions, wait_until

pytestmark = pytest.mark.slow

TASKS = 240
#: Window 8 (2 processes x multiplier 4): every poll after the first asks for >= 4. Before
#: the change the average was ~2.2 per poll.
MIN_PER_POLL = 3.5


def test_a_backlog_is_polled_in_half_windows(database_url, producer, start_worker):
    for i in range(TASKS):
        tagged.apply_async((i,))
    worker = start_worker("-P", "prefork", "-c", "2", env={"DELAYQ_PREFETCH": "4"})
    try:
        wait_until(lambda: len(executions(database_url, "tagged")) >= TASKS, timeout=60,
                   message=f"{TASKS} tasks run")
    except AssertionError as exc:
        ran = len(executions(database_url, "tagged"))
        raise AssertionError(f"{exc}: {ran} ran; worker log:\n{worker.log()[-3000:]}") from exc
    tags = [json.loads(r["arg"]) for r in executions(database_url, "tagged")]
    polls = set(tags)
    assert len(tags) == TASKS and None not in polls
    assert TASKS / len(polls) >= MIN_PER_POLL, f"{len(polls)} polls for {TASKS} tasks"
