"""``celery inspect scheduled`` on delayq (issue 42 §4): a worker holds no ETA task in memory,
so it answers from the table, for the queues it consumes, in Celery's reply format; a task
that ran is no longer listed. A real ``celery worker`` subprocess, asked through the broker."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from .celery_app import mark
from .conftest import executions, nodename, wait_until

pytestmark = pytest.mark.slow

#: What Celery's own ``scheduled`` reply carries per request (``Request.info()``).
REQUEST_FIELDS = {"id", "name", "args", "kwargs", "type", "hostname", "time_start",
                  "acknowledged", "delivery_info", "worker_pid"}


def test_inspect_scheduled_lists_the_waiting_countdowns_of_the_workers_queues(
        database_url, producer, start_worker, dq, celery_cli) -> None:
    node = nodename(start_worker())
    inspect = producer.control.inspect(destination=[node], timeout=10)
    soon = [mark.apply_async((f"soon-{i}",), countdown=6 + i) for i in range(2)]
    later = mark.apply_async(("later",), kwargs={}, countdown=3600, priority=3)
    elsewhere = producer.send_task("celery_app.mark", ("elsewhere",), queue="not-consumed",
                                   countdown=60)
    stored = {r.id: dq.with_kind(kind).get(r.id).scheduled_at
              for r, kind in ((soon[0], "celery"), (soon[1], "celery"),
                              (later, "celery\x06\x163"))}

    entries = inspect.scheduled()[node]

    assert [e["request"]["id"] for e in entries] == [soon[0].id, soon[1].id, later.id], entries
    assert elsewhere.id not in {e["request"]["id"] for e in entries}  # not the worker's queue
    for e in entries:
        assert set(e) == {"eta", "priority", "request"} and set(e["request"]) == REQUEST_FIELDS
        assert datetime.fromisoformat(e["eta"]) == stored[e["request"]["id"]]
        assert e["request"]["name"] == "celery_app.mark" and e["request"]["hostname"] == node
    assert [e["request"]["args"] for e in entries] == [["soon-0"], ["soon-1"], ["later"]]
    assert entries[2]["priority"] == 3 and entries[2]["request"]["kwargs"] == {}

    ran = wait_until(lambda: len(executions(database_url)) == 2 and executions(database_url),
                     timeout=30, message="the two countdowns run")
    assert {r["task_id"] for r in ran} == {soon[0].id, soon[1].id}
    assert [e["request"]["id"] for e in inspect.scheduled()[node]] == [later.id]
    cli = celery_cli("inspect", "scheduled", "-d", node, "-t", "10", "-j")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert [e["request"]["id"] for e in json.loads(cli.stdout)[node]] == [later.id]
