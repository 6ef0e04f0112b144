"""The worker (delayq_transport/django/worker.py) in this process, on a thread: results as
Django defines them (status, timestamps, return value, errors with class path and traceback,
attempts, worker ids), async tasks, priority across queues in one poll, retries with backoff
(each attempt recorded), signals, the redelivery of a task whose outcome is already written,
pruning and a shutdown that lets a running task finish."""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.utils import timezone

from delayq_transport.django._framework import (
    SOURCE,
    InvalidTask,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from delayq_transport.django.backend import encode
from delayq_transport.django.tasks import DelayqBackend

from .conftest import finished, row_count, running, runs, sql, wait_until


def test_results_as_django_defines_them(dj_url: str) -> None:
    from shop import djtasks

    with running() as worker:
        ok = djtasks.add.enqueue(2, b=3)
        mail = djtasks.mail_add.enqueue(4, 5)
        coro = djtasks.async_add.enqueue(6, 7)
        bad = djtasks.fail.enqueue("boom")
        odd = djtasks.unserialisable.enqueue()
        ctx = djtasks.record.enqueue("ctx")
        for result in (ok, mail, coro, bad, odd, ctx):
            finished(result)
    assert (ok.status, ok.return_value, mail.return_value, coro.return_value) == (
        TaskResultStatus.SUCCESSFUL, 5, 9, 13)
    assert ctx.return_value == "ctx" and runs(dj_url) == [("ctx", ctx.id, 1, runs(dj_url)[0][3])]
    for result in (ok, mail, coro, ctx):
        assert result.errors == [] and result.attempts == 1 and result.is_finished is True
        assert result.worker_ids == [worker.worker_id]
        assert result.enqueued_at <= result.started_at <= result.last_attempted_at
        assert result.last_attempted_at <= result.finished_at
    assert bad.status == TaskResultStatus.FAILED and bad.attempts == 1
    with pytest.raises(ValueError, match="Task failed"):
        bad.return_value  # noqa: B018
    [error] = bad.errors
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: boom\n") and "djtasks.py" in error.traceback
    assert bad.is_finished is True and bad.finished_at >= bad.started_at >= bad.enqueued_at
    [error] = odd.errors  # a return value JSON cannot hold fails the task, as in Django
    assert odd.status == TaskResultStatus.FAILED and error.exception_class is TypeError
    assert "Unsupported type" in error.traceback and odd._return_value is None
    assert row_count(dj_url) == 0  # every row acked


def test_a_task_raising_an_exception_that_holds_an_exception_fails_with_its_repr(
        dj_url: str) -> None:
    from shop import djtasks

    with running():
        result = finished(djtasks.nested_error.enqueue("inner"))
    assert result.status == TaskResultStatus.FAILED and result._return_value is None
    [error] = result.errors
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: inner\n")  # str() of the outer one
    assert "raise ValueError(ValueError(message))" in error.traceback  # the line that raised


def test_a_task_that_raises_keyboardinterrupt_fails_and_the_worker_goes_on(
        dj_url: str) -> None:
    """A deliberate difference from Django's ImmediateBackend, which runs the task inside
    ``enqueue()``, so a KeyboardInterrupt the task raises reaches the caller (its test
    "throws keyboard interrupt"). Delayq runs the task in a worker: whatever it raises,
    SystemExit and KeyboardInterrupt included, is the task's failure, recorded with its
    traceback; the caller's enqueue returned long before, and the worker takes the next task.
    (A SystemExit fails the task in Django's ImmediateBackend too.)"""
    from shop import djtasks

    with running(threads=1):
        interrupted = finished(djtasks.interrupts.enqueue("stop"))
        exited = finished(djtasks.exits.enqueue("bye"))
        after = finished(djtasks.add.enqueue(1, 2))
    for result, kind, message in ((interrupted, KeyboardInterrupt, "stop"),
                                  (exited, SystemExit, "bye")):
        assert result.status == TaskResultStatus.FAILED and result.attempts == 1
        [error] = result.errors
        assert error.exception_class is kind
        assert error.traceback.endswith(f"{kind.__name__}: {message}\n")
    assert after.status == TaskResultStatus.SUCCESSFUL and after.return_value == 3


def test_each_run_is_logged_as_djangos_backends_log_it(
        dj_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Django logs ``task_started`` and ``task_finished`` (``django.tasks``): the worker sends
    them, so a task's log is enqueued, RUNNING, then SUCCESSFUL or FAILED (at ERROR, with the
    traceback)."""
    from shop import djtasks

    with caplog.at_level(logging.DEBUG, logger=SOURCE):
        ok = djtasks.add.enqueue(1, 1)  # before the worker starts: logged before it runs
        bad = djtasks.fail.enqueue("logged")
        with running(threads=1):
            finished(ok)
            finished(bad)
            wait_until(lambda: sum("state=" in r.getMessage() for r in caplog.records) == 4,
                       "four state lines")
    for result, last, level in ((ok, "state=SUCCESSFUL", logging.INFO),
                                (bad, "state=FAILED", logging.ERROR)):
        mine = [r for r in caplog.records
                if r.name == SOURCE and result.id in r.getMessage()]
        assert ["enqueued" in mine[0].getMessage(), "state=RUNNING" in mine[1].getMessage(),
                last in mine[2].getMessage()] == [True, True, True] and len(mine) == 3
        assert mine[2].levelno == level
    [failed] = [r for r in caplog.records if "state=FAILED" in r.getMessage()]
    assert failed.exc_info is not None and "logged" in str(failed.exc_info[1])


def test_a_task_whose_path_names_no_task_fails_without_running(dj_url: str) -> None:
    """A row whose task path no longer names a task (code removed or renamed since it was
    enqueued, or a path that never was one) is not run: the worker records it as failed with
    the reason and acks it, and goes on (django-tasks-db refuses such a row as well)."""
    from shop import djtasks

    backend = task_backends["default"]
    assert isinstance(backend, DelayqBackend)
    template = djtasks.add.enqueue(1, 1)
    sql(dj_url, "TRUNCATE delayed_queue")
    payload = json.loads(encode(template))
    bad = {"not-a-task": "shop.models.Order", "gone": "shop.nowhere.task"}
    for key, path in bad.items():
        backend.store().queue_for("django:default:0").offer(
            key, json.dumps({**payload, "task": path}).encode())
    with running():
        after = finished(djtasks.add.enqueue(2, 2))
        wait_until(lambda: row_count(dj_url) == 0, "every row settled")
    stored = dict((k, (s, e)) for k, s, e in sql(
        dj_url, 'SELECT "id", "status", "errors" FROM delayq_task_results WHERE "id" <> %s',
        [after.id]))
    assert stored.keys() == bad.keys()
    assert stored["not-a-task"][0] == "FAILED"
    # The framework's own class (the backport calls it InvalidTaskError).
    assert stored["not-a-task"][1][0]["exception_class_path"] == (
        f"{InvalidTask.__module__}.{InvalidTask.__qualname__}")
    assert stored["gone"][0] == "FAILED" and "ModuleNotFoundError" in str(stored["gone"][1])
    assert after.status == TaskResultStatus.SUCCESSFUL and runs(dj_url) == []


def test_priority_is_honoured_across_queues_in_one_poll(dj_url: str) -> None:
    from shop import djtasks

    order = [(-5, "default"), (50, "mail"), (0, "default"), (100, "default"), (-100, "mail"),
             (7, "mail"), (0, "mail"), (99, "default")]
    results = [djtasks.record.using(priority=p, queue_name=q).enqueue(f"{q}:{p}")
               for p, q in order]
    with running(threads=1):  # one at a time: the order they ran is the order taken
        for result in results:
            finished(result)
    ran = [label for label, *_ in runs(dj_url)]
    by_priority = sorted(order, key=lambda pq: -pq[0])
    assert [int(label.split(":")[1]) for label in ran] == [p for p, _ in by_priority]
    assert ran[:2] == ["default:100", "default:99"] and ran[-1] == "mail:-100"


def test_retries_back_off_and_every_attempt_is_recorded(dj_url: str) -> None:
    from shop import djtasks

    with running():
        recovers = djtasks.flaky.enqueue("recovers", 2)  # @retry(2, backoff=0.2)
        gives_up = djtasks.flaky.enqueue("gives-up", 9)
        finished(recovers)
        finished(gives_up)
    assert recovers.status == TaskResultStatus.SUCCESSFUL and recovers.return_value == 3
    assert recovers.attempts == 3 and len(recovers.errors) == 2
    assert [e.exception_class for e in recovers.errors] == [RuntimeError, RuntimeError]
    assert "attempt 1 fails" in recovers.errors[0].traceback
    assert gives_up.status == TaskResultStatus.FAILED and gives_up.attempts == 3
    assert len(gives_up.errors) == 3
    times = [r[0] for r in sql(dj_url, "SELECT ran FROM shop_taskrun WHERE label = "
                                       "'recovers' ORDER BY id")]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert gaps[0] >= timedelta(seconds=0.2) and gaps[1] >= timedelta(seconds=0.4), gaps


def test_the_backends_retries_option_is_every_tasks_default(dj_url: str) -> None:
    """``task_finished`` is sent once, for the final outcome: an attempt that will be retried
    has not finished the task."""
    from shop import djtasks

    seen: list[tuple[str, Any]] = []

    def ended(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        seen.append((task_result.id, task_result.status))

    task_finished.connect(ended)
    try:
        with running(RETRIES=1, BACKOFF=0.05):
            result = djtasks.fail.enqueue("again")
            finished(result)
            wait_until(lambda: seen, "task_finished")
    finally:
        task_finished.disconnect(ended)
    assert seen == [(result.id, TaskResultStatus.FAILED)]
    assert result.status == TaskResultStatus.FAILED and result.attempts == 2
    assert [e.exception_class for e in result.errors] == [ValueError, ValueError]


def test_run_after_is_waited_for(dj_url: str) -> None:
    from shop import djtasks

    at = timezone.now() + timedelta(milliseconds=700)
    with running():
        result = djtasks.add.using(run_after=at).enqueue(1, 1)
        finished(result)
    assert result.started_at >= at.replace(microsecond=at.microsecond // 1000 * 1000)


def test_task_started_and_finished_are_sent_and_a_raising_receiver_changes_nothing(
        dj_url: str) -> None:
    from shop import djtasks

    seen: list[tuple[str, str, Any]] = []

    def started(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        seen.append(("started", task_result.id, task_result.status))
        raise RuntimeError("a receiver that fails")

    def ended(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        seen.append(("finished", task_result.id, task_result.status))
        raise RuntimeError("another receiver that fails")

    task_started.connect(started)
    task_finished.connect(ended)
    try:
        with running():
            result = djtasks.record.enqueue("signals")
            finished(result)
            wait_until(lambda: len(seen) == 2, "both signals")
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(ended)
    assert seen == [("started", result.id, TaskResultStatus.RUNNING),
                    ("finished", result.id, TaskResultStatus.SUCCESSFUL)]
    assert result.status == TaskResultStatus.SUCCESSFUL and len(runs(dj_url)) == 1


def test_a_redelivered_task_whose_outcome_was_written_is_not_run_again(dj_url: str) -> None:
    """What a worker killed between writing the outcome and its ack leaves: the row comes
    back (here: written again, as the lease's end would hand it out) and is only acked."""
    from shop import djtasks

    with running() as worker:
        result = djtasks.record.enqueue("once")
        finished(result)
        wait_until(lambda: row_count(dj_url) == 0, "the ack")
        backend = task_backends["default"]
        assert isinstance(backend, DelayqBackend)
        backend.store().queue_for("django:default:0").offer(result.id, encode(result))
        wait_until(lambda: row_count(dj_url) == 0, "the redelivery's ack")
    result.refresh()
    assert len(runs(dj_url)) == 1 and result.worker_ids == [worker.worker_id]


def test_finished_results_are_pruned_after_the_retention(dj_url: str) -> None:
    from shop import djtasks

    with running(RESULT_RETENTION=0) as worker:
        done = djtasks.add.enqueue(1, 1)
        finished(done)
        waiting = djtasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, 2)
        assert worker.prune() == 1
    with pytest.raises(TaskResultDoesNotExist):
        done.refresh()
    waiting.refresh()
    assert waiting.status == TaskResultStatus.READY


def test_a_shutdown_lets_a_running_task_finish(dj_url: str) -> None:
    from shop import djtasks

    gate = djtasks.GATE_LOCK
    with psycopg.connect(dj_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [gate])
        with running() as worker:
            result = djtasks.gate.enqueue("shutdown")
            wait_until(lambda: runs(dj_url), "the task to start")
            stopper = threading.Thread(target=worker.stop)
            stopper.start()
            holder.execute("SELECT pg_advisory_unlock(%s)", [gate])
            stopper.join()
    assert [label for label, *_ in runs(dj_url)] == ["shutdown:start", "shutdown:end"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and row_count(dj_url) == 0



def test_the_page_shows_a_tasks_outcome_from_delayqs_task_results(dj_url: str) -> None:
    """``delayq web`` needs no result backend for these tasks: the worker's record is read."""
    from shop import djtasks
    from starlette.testclient import TestClient

    from delayq_transport import DelayedQueue
    from delayq_transport.web.app import create_app
    from delayq_transport.web.security import WebConfig

    with running():
        ok = finished(djtasks.add.enqueue(20, 22))
        bad = finished(djtasks.fail.enqueue("page"))
    with DelayedQueue(dj_url, kind="django:default:0") as queue:
        client = TestClient(create_app(queue, WebConfig()), base_url="http://127.0.0.1:8377")
        shown = client.get(f"/api/outcomes/{ok.id}").json()
        assert (shown["state"], shown["result"], shown["source"], shown["ready"]) == (
            "SUCCESSFUL", 42, "delayq", True)
        failed = client.get(f"/api/outcomes/{bad.id}").json()
        assert failed["state"] == "FAILED" and failed["result"] == "builtins.ValueError"
        assert failed["traceback"].endswith("ValueError: page\n")
        page = client.get(f"/tasks/{ok.id}")  # it ran: the task page sends to its outcome
        assert page.status_code == 200 and "from delayq&#39;s task results" in page.text
        assert client.get(f"/api/outcomes/{'nope'}").status_code == 404


def test_a_worker_polls_only_the_kinds_that_hold_rows() -> None:
    """Of each queue's 201 priorities, the kinds a scan found or a wake-up named; every kind
    when wake-ups cannot be heard."""
    from delayq_transport.django.worker import LiveKinds

    kinds = ["django:a:1", "django:b:1", "django:a:0", "django:b:0"]
    found: list[str] = []
    live = LiveKinds(kinds, lambda: list(found))
    assert live.order() == ["django:a:1"]  # nothing known: one kind, never an empty poll
    found += ["django:b:0", "celery"]
    live.rescan()
    assert live.order() == ["django:b:0"]
    live.heard("\x1edjango:a:1")  # a search marker names its kind too
    live.heard("django:other:5")  # not this worker's
    assert live.order() == ["django:a:1", "django:b:0"]  # in priority order, and it stays
    found.clear()
    live.rescan()
    assert live.order() == ["django:a:1", "django:b:0"]
    live.everything = True
    assert live.order() == kinds
