"""The URL swap from the command line: ``celery inspect/control/status/purge/beat`` on delayq.

Every command here is a real ``python -m celery -A celery_app ...`` subprocess whose only broker
setting is the ``delayq+postgresql://`` URL (plus ``import delayq_transport`` in the app module).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from delayq_transport import DelayedQueue

from .celery_app import mark
from .conftest import executions, nodename, row_count, wait_until

pytestmark = pytest.mark.slow

REPLY_TIMEOUT = "10"  # with -d the command returns at the first reply; this is only a ceiling


def ok(completed: Any) -> str:
    """stdout of a CLI run that must have succeeded (its output is the failure message)."""
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    return output


def remote(celery_cli: Any, node: str, *args: str) -> str:
    """A remote-control command addressed to one worker, which must reply."""
    return ok(celery_cli(*args, "-d", node, "-t", REPLY_TIMEOUT))


def test_inspect_control_status_and_shutdown(database_url, celery_cli, start_worker, producer):
    worker = start_worker()
    node = nodename(worker)

    assert "pong" in remote(celery_cli, node, "inspect", "ping")
    queues = json.loads(remote(celery_cli, node, "inspect", "active_queues", "-j"))
    assert [q["name"] for q in queues[node]] == ["celery"]

    assert "add consumer q3" in remote(celery_cli, node, "control", "add_consumer", "q3")
    producer.send_task("celery_app.mark", ("via-q3",), queue="q3")
    wait_until(lambda: executions(database_url), timeout=15, message="task on the added queue")
    assert "rate limit set successfully" in remote(
        celery_cli, node, "control", "rate_limit", "celery_app.mark", "100/m")
    assert "no longer consuming from" in remote(celery_cli, node, "control", "cancel_consumer",
                                                 "q3")
    active = producer.control.inspect(destination=[node], timeout=10).active_queues()
    assert [q["name"] for q in active[node]] == ["celery"]

    status = remote(celery_cli, node, "status")
    assert node in status and "1 node online" in status

    # Celery's shutdown command never replies (the worker is gone), on any broker: the CLI
    # reports "No nodes replied"; what counts is that the worker received it and exited.
    celery_cli("control", "shutdown", "-d", node, "-t", "1")
    assert worker.proc.wait(timeout=20) == 0
    assert "Got shutdown from remote" in worker.log()


def test_purge_deletes_waiting_rows_of_known_queues(database_url, celery_cli, producer, dq):
    for i in range(5):
        mark.apply_async((i,), countdown=3600)
    mark.delay("due now")
    kept = producer.send_task("celery_app.mark", ("other queue",), queue="keep")
    assert dq.count_waiting() == 6

    output = ok(celery_cli("purge", "-f"))

    assert "Purged 6 messages" in output
    assert dq.count_waiting() == 0
    assert row_count(dq) == 1 and dq.with_kind("keep").contains(kept.id)


def test_celery_beat_default_scheduler_publishes(database_url, start_celery, start_worker,
                                                 tmp_path):
    env = {"DELAYQ_BEAT_EVERY": "1"}
    start_worker(env=env)
    beat = start_celery("beat", "--loglevel=INFO", "-s", str(tmp_path / "beat-schedule"),
                        env=env, name="beat")
    runs = wait_until(lambda: len(executions(database_url, "mark")) >= 3
                      and executions(database_url, "mark"), timeout=20, message="3 beat ticks")
    assert {r["arg"] for r in runs} == {'"beat"'}
    assert len({r["task_id"] for r in runs}) == len(runs)
    assert "Sending due task mark-every (celery_app.mark)" in beat.log()


def test_transport_options_table_and_acquire_timeout(database_url, start_worker, make_app, dq):
    options = {"table": "custom_q", "acquire_timeout": 7, "polling_interval": 2}
    start_worker(env={"DELAYQ_TRANSPORT_OPTIONS": json.dumps(options), "DELAYQ_ACKS_LATE": "1"})
    app = make_app(broker_transport_options=options)

    result = app.send_task("celery_app.sleepy", (2, "custom table"))

    with DelayedQueue(database_url, kind="celery", table="custom_q", ensure_schema=False) as q:
        row = wait_until(lambda: (r := q.get(result.id)) is not None and r.in_flight and r,
                         timeout=15, message="the task leased from custom_q")
        lease = (row.scheduled_at - q.now()).total_seconds()
        # A live lease, at most acquire_timeout long (the default would be far longer).
        assert 0 < lease <= 7.05, lease
        assert row_count(dq) == 0  # nothing went to the default table
        wait_until(lambda: executions(database_url, "sleepy"), timeout=15, message="task ran")
        wait_until(lambda: not q.contains(result.id), timeout=5, message="row acked")
