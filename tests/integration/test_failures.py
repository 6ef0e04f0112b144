"""Failed and retrying tasks (delayq_transport/browse/failures.py), for every front end, in one
list and through one retry and one discard: django.tasks results recorded as its worker records
them (core TaskResults, the row leased, then acked or released), Dramatiq dead letters made by
the broker's own nack, Celery retries as a Celery worker republishes them (the ``retries``
header). The CLI on top (``delayq tasks list --state failed|retrying``, ``show`` of a task
that left the queue, ``retry``, ``discard``) with its exit statuses.

The worker processes of each front end are exercised end to end elsewhere:
tests/djtasks/test_failures_admin.py runs a real ``manage.py delayq_worker`` on a failed task
that is retried from the admin."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from _dead_letters import dead_letters
from click.testing import CliRunner

from delayq_transport import DelayedQueue
from delayq_transport.browse import TaskFilter, TaskInFlight, TaskNotFound
from delayq_transport.browse.failures import FailureService
from delayq_transport.cli import main
from delayq_transport.core import InvalidInput, LostAttempt, TaskResults
from delayq_transport.formats.celery import encode, kind_for, task_message

#: An attempt begun by hand, as a worker begins one.
STARTED: dict[str, Any] = {
    "alive_ms": 10_000,
    "lost": LostAttempt("x.TaskInterrupted", "attempt %s (worker %s) was lost"),
}

KIND = "django:default:0"
T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


def django_task(name: str, queue: str = "default") -> bytes:
    return json.dumps({"task": name, "args": [1], "kwargs": {}, "backend": "default",
                       "queue": queue, "priority": 0, "run_after_us": None,
                       "enqueued_at": 1}).encode()


def error(message: str) -> dict[str, str]:
    return {"exception_class_path": "builtins.ValueError",
            "traceback": f"Traceback (most recent call last):\nValueError: {message}\n"}


def run_django(queue: DelayedQueue, key: str, task: str, *, fails: bool, retry: bool = False,
               queue_name: str = "default") -> None:
    """One attempt of a django.tasks task as its worker makes it: the row leased, the attempt
    recorded, then the outcome written and the row acked (or released for a retry)."""
    kinds = f"django:{queue_name}:0"
    results = TaskResults(queue, "django:")
    payload = django_task(task, queue_name)
    queue.with_kind(kinds).offer(key, payload)
    [env] = [e for e in queue.try_poll_many(10, [kinds]) if e.key == key]
    results.start(key, payload.decode(), 1, "host:1", queue.clock_ms() or 1, **STARTED)
    if not fails:
        results.finish(key, "SUCCESSFUL", 2, finished=True, return_json="2")
    elif retry:
        results.finish(key, "READY", 2, finished=False, error=error(f"{key} once"))
        queue.release([env], delay=3600)
        return
    else:
        results.finish(key, "FAILED", 2, finished=True, error=error(f"{key} for good"))
    queue.ack(env)


def dead_letter(url: str, actor: str) -> None:
    """A Dramatiq message that failed for good, through the broker's own nack."""
    dead_letters(url, [(actor, 1)])


def celery_retry(queue: DelayedQueue, task: str, retries: int) -> str:
    """A Celery task as a worker's ``self.retry()`` republishes it (retries counted)."""
    msg = task_message(task, [1], {}, eta=T0, retries=retries)
    key = str(msg["headers"]["id"])
    queue.with_kind(kind_for("celery", 0)).offer(key, encode(msg), T0)
    return key


@pytest.fixture
def queue(database_url: str) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind=KIND) as q:
        yield q


@pytest.fixture
def svc(queue: DelayedQueue) -> FailureService:
    return FailureService(queue)


def refs(page: Any) -> list[str]:
    return [f.ref for f in page.items]


def test_failed_lists_every_front_end_newest_first_and_pages(
        queue: DelayedQueue, svc: FailureService, database_url: str) -> None:
    run_django(queue, "ok", "shop.add", fails=False)
    run_django(queue, "d1", "shop.charge", fails=True)
    dead_letter(database_url, "payments.charge")
    run_django(queue, "d2", "shop.mail", fails=True, queue_name="mail")
    run_django(queue, "r1", "shop.charge", fails=True, retry=True)
    # Results are timed by the worker's clock (ms 2 here), dead letters by the database's:
    # the dead letter is newest, then the two django.tasks failures (same ms: by id).
    page = svc.failed_page()
    letter = page.items[0]
    assert [f.source for f in page.items] == ["dramatiq", "django.tasks", "django.tasks"]
    assert refs(page)[1:] == ["d2", "d1"] and page.next_cursor is None
    assert letter.ref.startswith("#") and letter.task == "payments.charge"
    assert letter.exception is not None and "payments.charge broke" in letter.exception
    assert letter.attempts == 4  # the first and its 3 retries
    d1 = page.items[2]
    assert (d1.task, d1.queue, d1.attempts, d1.exception) == \
        ("shop.charge", "default", 1, "ValueError: d1 for good")
    # One at a time, across the sources, nothing lost or repeated.
    seen, cursor = [], None
    while True:
        one = svc.failed_page(cursor=cursor, limit=1)
        seen += refs(one)
        if one.next_cursor is None:
            break
        cursor = one.next_cursor
    assert seen == refs(page)
    assert refs(svc.failed_page("mail")) == ["d2"]
    assert refs(svc.failed_page(task="shop.*")) == ["d2", "d1"]
    assert refs(svc.failed_page(task="payments.*")) == [letter.ref]
    full = svc.failure("d1")
    assert full.traceback is not None and full.traceback.endswith("ValueError: d1 for good\n")
    with pytest.raises(TaskNotFound):
        svc.failure("ok")  # it did not fail
    with pytest.raises(InvalidInput):
        svc.failed_page(cursor="not-a-cursor")


def test_retrying_is_a_row_state_of_every_front_end(queue: DelayedQueue, svc: FailureService,
                                                    database_url: str) -> None:
    run_django(queue, "r1", "shop.charge", fails=True, retry=True)
    dead_letter(database_url, "payments.charge")  # retried 3 times, but waits for nothing
    queue.with_kind(KIND).offer("fresh", django_task("shop.add"), T0)  # never ran
    celery = celery_retry(queue, "billing.remind", 2)
    celery_retry(queue, "billing.remind", 0)  # a first attempt, not a retry
    page = svc.tasks.list_page(TaskFilter.parse(state="retrying"))
    assert sorted(v.row.key for v in page.items) == sorted(["r1", celery])
    assert [v.row.key for v in svc.tasks.list_page(TaskFilter.parse(
        state="retrying", queue="celery")).items] == [celery]


def test_retry_and_discard_do_what_the_id_names(queue: DelayedQueue, svc: FailureService,
                                                database_url: str) -> None:
    run_django(queue, "d1", "shop.charge", fails=True)
    run_django(queue, "d2", "shop.charge", fails=True)
    run_django(queue, "r1", "shop.charge", fails=True, retry=True)
    dead_letter(database_url, "payments.charge")
    dead_letter(database_url, "mail.render")
    letters = [f.ref for f in svc.failed_page().items if f.source == "dramatiq"]
    celery = celery_retry(queue, "billing.remind", 1)
    results = TaskResults(queue, "django:")

    # A failed django.tasks task: its result READY again and a row due now, errors kept.
    assert "one more attempt" in svc.retry("d1").detail
    row = queue.with_kind(KIND).get("d1")
    assert row is not None and row.scheduled_at <= queue.now()
    stored = results.get("d1")
    assert stored is not None and stored.status == "READY" and stored.finished_at_ms is None
    assert len(stored.errors) == 1 and stored.worker_ids == ["host:1"]
    assert "d1" not in refs(svc.failed_page())
    assert "due at" in svc.retry("d1").detail  # a waiting row now: made due now again
    with pytest.raises(TaskNotFound):
        svc.retry("no-such-task")
    # Discard: the result goes.
    assert "1 result(s) deleted" in svc.discard("d2").detail
    assert results.get("d2") is None
    with pytest.raises(TaskNotFound):
        svc.discard("d2")

    # A dead letter: requeued (retries reset), or deleted.
    assert "requeued" in svc.retry(letters[0]).detail
    assert "deleted" in svc.discard(letters[1]).detail
    assert [f for f in svc.failed_page().items if f.source == "dramatiq"] == []

    # A retrying Celery task: run now; a retrying django.tasks task: row and result go.
    assert "due at" in svc.retry(celery).detail
    assert queue.with_kind(kind_for("celery", 0)).get(celery).scheduled_at <= queue.now()  # type: ignore[union-attr]
    assert "1 waiting row(s) and 1 result(s) deleted" in svc.discard("r1").detail
    assert queue.with_kind(KIND).get("r1") is None and results.get("r1") is None
    assert "cancelled" in svc.discard(celery).detail

    # A row a worker holds is left alone.
    queue.with_kind(KIND).offer("held", django_task("shop.add"))
    queue.try_poll_many(5, [KIND])
    with pytest.raises(TaskInFlight):
        svc.retry("held")
    with pytest.raises(TaskInFlight):
        svc.discard("held")


def test_a_retry_whose_row_is_still_there_changes_nothing(queue: DelayedQueue,
                                                          svc: FailureService) -> None:
    """The outcome is written before the row's ack: between them the row is still there, and a
    retry must neither leave the result READY with no row of its own nor double the row."""
    results = TaskResults(queue, "django:")
    payload = django_task("shop.charge")
    queue.with_kind(KIND).offer("pending-ack", payload)
    [env] = queue.try_poll_many(1, [KIND])
    results.start("pending-ack", payload.decode(), 1, "w", 1, **STARTED)
    results.finish("pending-ack", "FAILED", 2, finished=True, error=error("x"))
    with pytest.raises(InvalidInput, match="acknowledgement is pending"):
        results.reopen("pending-ack", KIND, payload, 3)
    assert results.get("pending-ack").status == "FAILED"  # type: ignore[union-attr]
    queue.ack(env)
    assert results.reopen("pending-ack", KIND, payload, 3)
    assert not results.reopen("pending-ack", KIND, payload, 4)  # READY now: not again


def test_cli_lists_shows_retries_and_discards(queue: DelayedQueue, database_url: str) -> None:
    run_django(queue, "d1", "shop.charge", fails=True)
    run_django(queue, "ok", "shop.add", fails=False)
    run_django(queue, "r1", "shop.charge", fails=True, retry=True)
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(main, ["-d", database_url, "tasks", *args])
        assert result.exit_code == code, result.output
        return result.output

    listed = json.loads(run("list", "--state", "failed", "--json"))
    assert [f["ref"] for f in listed["failed"]] == ["d1"] and listed["next_cursor"] is None
    assert listed["failed"][0]["exception"] == "ValueError: d1 for good"
    table = run("list", "--state", "failed")
    assert "d1" in table and "shop.charge" in table and "delayq tasks retry|discard" in table
    retrying = json.loads(run("list", "--state", "retrying", "--json"))
    assert [t["key"] for t in retrying["tasks"]] == ["r1"]
    assert "--state failed takes --queue and --task" in run(
        "list", "--state", "failed", "--search", "x", code=2)
    assert "not --all-occurrences" in run("list", "--state", "failed", "--all-occurrences", code=2)
    # show: a finished task's outcome, from delayq's results; unknown ids say so (exit 1).
    shown = json.loads(run("show", "d1", "--json"))
    assert (shown["state"], shown["source"], shown["result"]) == \
        ("FAILED", "delayq", "builtins.ValueError")
    assert "ValueError: d1 for good" in shown["traceback"]
    assert "SUCCESSFUL" in run("show", "ok")
    assert "--result-backend" in run("show", "no-such-task", code=1)
    assert json.loads(run("retry", "d1", "--json"))["action"] == "retry"
    assert "discarded" in run("discard", "r1")
    assert "discarded" in run("discard", "d1")  # retried: its waiting row and result go
    assert "no task" in run("discard", "d1", code=1)
    assert "no task" in run("retry", "no-such-task", code=1)


def test_failed_page_at_the_start_reads_nothing_when_nothing_failed(svc: FailureService) -> None:
    page = svc.failed_page()
    assert page.items == [] and page.next_cursor is None


def test_a_page_of_failures_skips_what_filters_reject_and_continues(
        queue: DelayedQueue, svc: FailureService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk of the failed results is bounded: a filter that rejects what it walked gives
    a page with a cursor where the walk stopped, and the next page continues from there."""
    from delayq_transport.browse import failures

    monkeypatch.setattr(failures, "WALK_BUDGET", 3)
    for i in range(5):
        run_django(queue, f"x{i}", "shop.other", fails=True)
    run_django(queue, "a0", "shop.wanted", fails=True)  # id sorts first: walked last
    first = svc.failed_page(task="shop.wanted")
    assert first.items == [] and first.next_cursor is not None
    second = svc.failed_page(task="shop.wanted", cursor=first.next_cursor)
    assert refs(second) == ["a0"]
