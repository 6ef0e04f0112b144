"""Countdowns live in the database: on time, never early, expired or revoked ones never run,
and a worker's memory does not grow with the number of tasks scheduled for later."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone

import psutil
import pytest

from delayq_transport import Offer
from delayq_transport.formats.celery import encode, task_message

from .celery_app import mark
from .conftest import executions, in_flight, wait_until

pytestmark = pytest.mark.slow

MB = 1024 * 1024
BULK_ROWS = 100_000
API_ROWS = 2_000
PLACEHOLDER_ID = "00000000-0000-4000-8000-000000000000"


def lateness(row: dict) -> float:
    """Seconds between the ETA the task carried and when it ran (database clock, same host)."""
    return (row["ran_at"] - datetime.fromisoformat(row["eta"])).total_seconds()


def test_eta_and_countdown_run_on_time_never_early(database_url, producer, start_worker, dq):
    start_worker()
    eta = (datetime.now(UTC) + timedelta(seconds=2)).astimezone(timezone(timedelta(hours=-5)))
    by_eta = mark.apply_async(("eta",), eta=eta)
    by_countdown = mark.apply_async(("countdown",), countdown=2.5)
    scheduled = {r.id: dq.get(r.id).scheduled_at for r in (by_eta, by_countdown)}

    rows = wait_until(lambda: len(executions(database_url)) == 2 and executions(database_url),
                      timeout=15, message="both timed tasks")

    assert datetime.fromisoformat(rows[0]["eta"]) == eta  # an aware ETA in any zone is kept
    for row in rows:
        # The row waited until the ETA the message carries (milliseconds in the table).
        carried = datetime.fromisoformat(row["eta"])
        assert abs((scheduled[row["task_id"]] - carried).total_seconds()) < 0.001
        assert lateness(row) >= 0, (row["arg"], lateness(row))  # never early


def test_expired_tasks_are_discarded_not_run(database_url, producer, start_worker, dq):
    worker = start_worker()
    past = mark.apply_async(("past",), expires=datetime.now(UTC) - timedelta(seconds=5))
    lapsed = mark.apply_async(("lapsed",), countdown=1.0, expires=0.5)  # expires before its ETA
    fresh = mark.apply_async(("fresh",), countdown=1.5, expires=60)

    wait_until(lambda: executions(database_url), timeout=15, message="the unexpired task")
    wait_until(lambda: not any(dq.contains(r.id) for r in (past, lapsed, fresh)), timeout=5,
               message="every row acked")

    assert [r["task_id"] for r in executions(database_url)] == [fresh.id]
    for discarded in (past, lapsed):
        assert f"Discarding revoked task: celery_app.mark[{discarded.id}]" in worker.log()


def test_revoking_a_scheduled_task_deletes_its_row(database_url, producer, start_worker, dq):
    start_worker()
    by_result = mark.apply_async(("revoked via AsyncResult",), countdown=2)
    by_control = mark.apply_async(("revoked via control",), countdown=2)
    sentinel = mark.apply_async(("sentinel",), countdown=2.5)
    assert dq.contains(by_result.id) and dq.contains(by_control.id)

    by_result.revoke()
    producer.control.revoke(by_control.id)

    assert not dq.contains(by_result.id) and not dq.contains(by_control.id)
    assert dq.contains(sentinel.id)
    # The revoked tasks were due before the sentinel: had they been kept they would run first.
    wait_until(lambda: executions(database_url), timeout=15, message="the sentinel")
    assert [r["task_id"] for r in executions(database_url)] == [sentinel.id]


@contextmanager
def peak_rss(pid: int, interval: float = 0.1) -> Iterator[list[int]]:
    """Sample a process's RSS in the background; the list holds the peak seen so far."""
    proc, peak, done = psutil.Process(pid), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            done.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


def bulk_offers(count: int, eta: datetime) -> Iterator[Offer]:
    """Rows as beat/Spark write them (``task_message``), each with its own task id."""
    template = encode(task_message("celery_app.mark", ("bulk",), task_id=PLACEHOLDER_ID, eta=eta))
    for _ in range(count):
        task_id = str(uuid.uuid4())
        yield Offer(task_id, template.replace(PLACEHOLDER_ID.encode(), task_id.encode()), eta)


def test_100k_countdowns_leave_idle_worker_memory_flat(database_url, producer, start_worker, dq):
    worker = start_worker()
    idle = psutil.Process(worker.proc.pid).memory_info().rss
    eta = datetime.now(UTC) + timedelta(hours=1)

    with peak_rss(worker.proc.pid) as peak, ThreadPoolExecutor(4) as publishers:
        # Each apply_async is one committed INSERT: publish from threads while the bulk goes in.
        sent = publishers.map(lambda i: mark.apply_async((i,), countdown=3600), range(API_ROWS))
        dq.offer_batch(bulk_offers(BULK_ROWS, eta), can_update=False)
        assert len(list(sent)) == API_ROWS
        # "Must not grow within 10 s": a bounded wait that is expected to time out.
        with pytest.raises(AssertionError, match="timed out"):
            wait_until(lambda: peak[0] > idle + 20 * MB, timeout=10, interval=0.2)

    assert peak[0] - idle <= 20 * MB, f"RSS grew {(peak[0] - idle) / MB:.1f} MB"
    (status,) = dq.status(exact=True)  # 102k rows: past the default count cap
    assert (status.scheduled, status.due, in_flight(dq)) == (BULK_ROWS + API_ROWS, 0, 0)
    now = mark.delay("due now")  # the worker still serves due tasks past the scheduled pile
    wait_until(lambda: executions(database_url), timeout=10, message="a due task")
    assert [r["task_id"] for r in executions(database_url)] == [now.id]
