"""Task results (core/task_results.py), what the django.tasks worker records about each
attempt, without Django: an attempt begins RUNNING with its worker appended, ends SUCCESSFUL,
FAILED or READY again (a retry), errors accumulate; a result that is final refuses a new
attempt (the redelivery after a crash between the outcome and the ack); ``get`` reads the
result and the queue row in one statement; pruning deletes finished results past a
retention only; the table is shared by queue tables, and uninstall takes a table's rows.
Interruptions (migration 17): a RUNNING attempt whose liveness lapsed, or whose row is not held,
reads as interrupted, with its row's due time; the next claim records it; a given-back attempt
is READY with its entry, and only that attempt while it runs is changed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from delayq_transport import Database, DelayedQueue, migrate
from delayq_transport.core import Envelope, LostAttempt, TaskResults
from delayq_transport.core.ledgers import Attempt
from delayq_transport.core.schema import uninstall
from delayq_transport.formats.django_tasks import INTERRUPTED_PATH, result_truth

PREFIX = "django:"
PAYLOAD = {"task": "shop.tasks.add", "args": [1], "kwargs": {}, "backend": "default",
           "queue": "default", "priority": 0}


@pytest.fixture
def results(database_url: str) -> Iterator[TaskResults]:
    with DelayedQueue(database_url, kind="django:default:0") as queue:
        yield TaskResults(queue, PREFIX)


def _task_json() -> str:
    return json.dumps(PAYLOAD)


#: What a claim records of an attempt it finds unsettled (the worker passes the real text).
LOST = LostAttempt("x.TaskInterrupted", "attempt %s (worker %s) was lost")


def start(results: TaskResults, key: str, task_json: str, enqueued_at: int | None,
          worker: str, at: int, alive_ms: int = 60_000) -> Attempt | None:
    return results.start(key, task_json, enqueued_at, worker, at, alive_ms=alive_ms, lost=LOST)


def test_a_waiting_task_reads_from_its_queue_row_then_from_its_result(
        results: TaskResults) -> None:
    assert results.get("t1") is None
    results.queue.offer("t1", _task_json().encode())
    waiting = results.get("t1")
    assert waiting is not None and waiting.status is None and waiting.queued
    assert not waiting.leased and waiting.task == PAYLOAD and waiting.worker_ids == []
    [env] = results.queue.try_poll_many(1)
    assert results.get("t1").leased  # type: ignore[union-attr]
    attempt = start(results, "t1", _task_json(), 1_000, "w1", 2_000)
    assert attempt is not None and attempt.worker_ids == ["w1"] and attempt.errors == []
    running = results.get("t1")
    assert running is not None and (running.status, running.started_at_ms,
                                    running.enqueued_at_ms) == ("RUNNING", 2_000, 1_000)
    results.finish("t1", "SUCCESSFUL", 3_000, finished=True, return_json='{"n": 42}')
    results.queue.ack(env)
    done = results.get("t1")
    assert done is not None and not done.queued
    assert (done.status, done.return_value, done.finished_at_ms) == ("SUCCESSFUL", {"n": 42},
                                                                    3_000)


def test_attempts_accumulate_and_a_final_result_refuses_another(results: TaskResults) -> None:
    error = {"exception_class_path": "builtins.ValueError", "traceback": "ValueError: x\n"}
    assert start(results, "t2", _task_json(), None, "w1", 10) is not None
    results.finish("t2", "READY", 20, finished=False, error=error)
    second = start(results, "t2", _task_json(), None, "w2", 30)
    assert second is not None and second.worker_ids == ["w1", "w2"]
    assert second.errors == [error] and second.started_at_ms == 10  # the first start stays
    results.finish("t2", "FAILED", 40, finished=True, error=error)
    stored = results.get("t2")
    assert stored is not None and stored.status == "FAILED" and len(stored.errors) == 2
    assert (stored.last_attempted_at_ms, stored.finished_at_ms) == (30, 40)
    assert start(results, "t2", _task_json(), None, "w3", 50) is None  # final: not again
    assert results.get("t2").worker_ids == ["w1", "w2"]  # type: ignore[union-attr]


def test_pruning_deletes_finished_results_past_the_retention_only(
        results: TaskResults) -> None:
    for key, finished_at in (("old", 100), ("new", 300)):
        start(results, key, _task_json(), None, "w", finished_at - 1)
        results.finish(key, "SUCCESSFUL", finished_at, finished=True, return_json="null")
    start(results, "retrying", _task_json(), None, "w", 50)
    results.finish("retrying", "READY", 60, finished=False)
    assert results.prune(200, batch=1) == 1
    assert results.get("old") is None
    assert results.get("new") is not None and results.get("retrying") is not None


def test_the_table_is_shared_and_uninstall_takes_only_a_tables_rows(database_url: str) -> None:
    with Database(database_url, max_size=2) as db:
        migrate(db, "other_queue")
        with DelayedQueue(db, kind="django:default:0") as a, \
                DelayedQueue(db, kind="django:default:0", table="other_queue") as b:
            mine, theirs = TaskResults(a, PREFIX), TaskResults(b, PREFIX)
            start(mine, "same-id", _task_json(), None, "w", 1)
            start(theirs, "same-id", _task_json(), None, "w", 2)
            assert mine.get("same-id").started_at_ms == 1  # type: ignore[union-attr]
            assert theirs.get("same-id").started_at_ms == 2  # type: ignore[union-attr]
            uninstall(db, "other_queue")
    with psycopg.connect(database_url) as conn:
        tables = [r[0] for r in conn.execute(
            'SELECT "tableName" FROM delayq_task_results').fetchall()]
    assert tables == ["delayed_queue"]


def test_the_kinds_that_hold_rows_are_found_by_prefix(results: TaskResults) -> None:
    """What a worker polls of its 201 priorities per queue (the others cost a descent each)."""
    assert results.kinds() == []
    for kind in ("django:mail:-3", "celery", "django:default:7", "django:default:7",
                 "dramatiq:default", "djangoX:y:1"):
        results.queue.with_kind(kind).offer(f"{kind}-{len(kind)}-{id(kind)}", b"{}")
    results.queue.with_kind("django:default:7").offer("second", b"{}")
    assert sorted(results.kinds()) == ["django:default:7", "django:mail:-3"]


def _claimed(results: TaskResults, key: str, worker: str = "w1", alive_ms: int = 60_000
             ) -> Envelope:
    results.queue.offer(key, _task_json().encode())
    [env] = results.queue.try_poll_many(1)
    assert start(results, key, _task_json(), None, worker, 100, alive_ms) is not None
    return env


def test_a_lapsed_liveness_reads_interrupted_until_the_next_claim_records_it(
        results: TaskResults) -> None:
    env = _claimed(results, "t3")
    running = results.get("t3")
    assert running is not None and running.status == "RUNNING" and not running.interrupted
    assert running.alive_until_ms is not None and running.leased
    assert results.touch(["t3", "unknown"], 60_000) == 1
    assert results.touch(["t3"], -1) == 1  # as if its worker stopped touching it a while ago
    lapsed = results.get("t3")
    assert lapsed is not None and lapsed.status == "RUNNING" and lapsed.interrupted
    row = results.queue.get("t3")
    assert row is not None and lapsed.leased
    assert lapsed.due_at_ms == row.scheduled_at_ms > env.scheduled_at_ms  # its lease's end
    assert lapsed.errors == []  # nothing stored: the reader shows it
    status, errors = result_truth(lapsed)
    assert status == "READY" and errors[-1]["exception_class_path"] == INTERRUPTED_PATH
    assert "attempt 1 (worker w1) was interrupted: its worker stopped" in errors[-1]["traceback"]
    assert "when its lease ends" in errors[-1]["traceback"]
    second = start(results, "t3", _task_json(), None, "w2", 200)
    assert second is not None and second.worker_ids == ["w1", "w2"]
    assert second.errors == [{"exception_class_path": "x.TaskInterrupted",
                              "traceback": "attempt 1 (worker w1) was lost"}]
    again = results.get("t3")
    assert again is not None and again.status == "RUNNING" and not again.interrupted


def test_a_given_back_attempt_is_ready_with_its_entry_and_nothing_else_changes(
        results: TaskResults) -> None:
    _claimed(results, "t4")
    entry = {"exception_class_path": INTERRUPTED_PATH, "traceback": "given back\n"}
    assert not results.interrupt("t4", 2, entry, 300)  # not the running attempt
    assert results.interrupt("t4", 1, entry, 300)
    stored = results.get("t4")
    assert stored is not None and (stored.status, stored.errors) == ("READY", [entry])
    assert not stored.interrupted and stored.alive_until_ms is None
    assert not results.interrupt("t4", 1, entry, 400)  # not RUNNING any more
    assert results.touch(["t4"], 60_000) == 0  # not revived
    _claimed(results, "t5")
    results.finish("t5", "SUCCESSFUL", 500, finished=True, return_json="1")
    assert not results.interrupt("t5", 1, entry, 600)  # an outcome written meanwhile stays
    assert results.get("t5").status == "SUCCESSFUL"  # type: ignore[union-attr]


def test_running_with_its_row_released_or_gone_reads_interrupted(results: TaskResults) -> None:
    env = _claimed(results, "t6")
    results.queue.release([env], 30)
    stored = results.get("t6")
    assert stored is not None and stored.interrupted and not stored.leased
    assert stored.due_at_ms is not None and stored.due_at_ms > env.scheduled_at_ms - 60_000
    assert "runs again from" in result_truth(stored)[1][-1]["traceback"]
    results.queue.delete("t6")
    gone = results.get("t6")
    assert gone is not None and gone.interrupted and gone.due_at_ms is None
    assert "no longer queued" in result_truth(gone)[1][-1]["traceback"]
