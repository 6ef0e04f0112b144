"""The URL swap end to end: a real ``celery worker`` on ``delayq+postgresql://``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from delayq_transport import DelayedQueue

from .celery_app import app, flaky, mark
from .conftest import executions, wait_until


def test_delay_apply_async_send_task(database_url, producer, start_worker):
    start_worker()
    mark.delay("delay")
    mark.apply_async(("apply_async",))
    app.send_task("celery_app.mark", ("send_task",))
    rows = wait_until(lambda: len(executions(database_url)) >= 3 and executions(database_url),
                      message="three tasks to run")
    assert sorted(r["arg"] for r in rows) == ['"apply_async"', '"delay"', '"send_task"']


def test_countdown_waits_in_database_not_in_worker(database_url, producer, start_worker):
    start_worker()
    before = datetime.now(UTC)
    result = mark.apply_async(("later",), countdown=2)
    after = datetime.now(UTC)
    with DelayedQueue(database_url, kind="celery") as q:
        row = q.get(result.id)
        assert row is not None and not row.in_flight
    # The row is due 2 s after the publish (milliseconds in the table), and ran no earlier.
    ms = timedelta(milliseconds=1)
    assert before + timedelta(seconds=2) - ms <= row.scheduled_at <= after + timedelta(seconds=2)
    ran = wait_until(lambda: executions(database_url), timeout=15, message="countdown task")
    assert ran[0]["ran_at"] >= row.scheduled_at - timedelta(milliseconds=50), ran[0]["ran_at"]


def test_retry_with_countdown_replaces_row(database_url, producer, start_worker):
    start_worker()
    result = flaky.apply_async(("x",), kwargs={"fail_times": 2, "countdown": 1})
    wait_until(lambda: executions(database_url, "flaky"), timeout=20, message="final flaky run")
    tries = [r["name"] for r in executions(database_url) if r["name"].startswith("flaky-try")]
    assert tries == ["flaky-try-0", "flaky-try-1", "flaky-try-2"]
    with DelayedQueue(database_url, kind="celery") as q:
        wait_until(lambda: not q.contains(result.id), message="acked row deleted")
