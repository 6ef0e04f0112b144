"""The backend's contract in this process: what ``django.tasks`` promises of a backend
(Django's ``BaseTaskBackend``, its tests/tasks in our own words) and what delayq adds: the
task is a row written by the core's one publish path, inside the caller's ``atomic()`` by
default, its result read from PostgreSQL; ``check()`` names a missing table or a wrong
database."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.db import transaction
from django.test.utils import override_settings
from django.utils import timezone

from delayq_transport.core.queue import due_ms
from delayq_transport.django._framework import (
    SOURCE,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_backends,
    task_enqueued,
)
from delayq_transport.django.backend import kind_of, kinds_for, to_ms
from delayq_transport.django.tasks import DelayqBackend

from .conftest import sql

BACKEND = "delayq_transport.django.tasks.DelayqBackend"


def tasks_setting(**options: Any) -> dict[str, Any]:
    return {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "mail"], "OPTIONS": options}}


def row(url: str, key: str) -> tuple[Any, ...] | None:
    rows = sql(url, 'SELECT "pKind", "scheduledAt", "lockUuid" FROM delayed_queue '
               'WHERE "pKey" = %s', [key])
    return rows[0] if rows else None


def test_the_backend_supports_everything_django_asks_of_a_production_backend() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, DelayqBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)
    assert backend.queues == {"default", "mail"} and backend.queue_names() == ["default", "mail"]


def test_validate_task_is_djangos(dj_url: str) -> None:
    from shop import djtasks

    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and"):
        djtasks.add.using(priority=101)
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid for backend."):
        djtasks.add.using(queue_name="nope")
    naive = timezone.make_naive(timezone.now() + timedelta(hours=1))
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime."):
        djtasks.add.using(run_after=naive)
    with pytest.raises(InvalidTask, match="Task function must be defined at a module level."):
        from delayq_transport.django._framework import task

        @task()
        def local() -> None: ...
    # Every queue and priority is a kind; the backend's QUEUES bound what a worker takes.
    assert kind_of("mail", -7) == "django:mail:-7"
    kinds = kinds_for(["default", "mail"])
    assert kinds[:2] == ["django:default:100", "django:mail:100"] and len(kinds) == 402
    assert kinds[-1] == "django:mail:-100"


def test_enqueue_writes_a_row_and_any_reader_gets_the_result_from_the_database(
        dj_url: str) -> None:
    from shop import djtasks

    result = djtasks.add.enqueue(1, b=2)
    assert result.status == TaskResultStatus.READY and result.attempts == 0
    assert result.is_finished is False and result.errors == [] and result.worker_ids == []
    assert result.enqueued_at is not None and result.started_at is None
    assert result.last_attempted_at is None and result.finished_at is None
    assert result.args == [1] and result.kwargs == {"b": 2} and result.backend == "default"
    kind, _, lock = row(dj_url, result.id) or (None, None, None)
    assert kind == "django:default:0" and lock is None
    # A backend instance of another thread (Django makes one per thread) reads it back.
    fresh = DelayqBackend("default", {"QUEUES": ["default", "mail"]})
    got = fresh.get_result(result.id)
    assert (got.id, got.status, got.args, got.kwargs, got.task) == (
        result.id, TaskResultStatus.READY, [1], {"b": 2}, djtasks.add)
    assert got == result  # every field, as Django's own tests compare them
    assert djtasks.add.get_result(result.id).id == result.id
    with pytest.raises(ValueError, match="Task has not finished yet"):
        got.return_value  # noqa: B018
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before  # nothing ran: refresh reads the same result


def test_aenqueue_and_aget_result(dj_url: str) -> None:
    from shop import djtasks

    async def flow() -> None:
        result = await djtasks.async_add.aenqueue(2, 3)
        got = await default_task_backend.aget_result(result.id)
        assert got.task == djtasks.async_add and got.args == [2, 3] and got == result
        before = dataclasses.asdict(result)
        await result.arefresh()
        assert dataclasses.asdict(result) == before
        assert (await djtasks.async_add.aget_result(result.id)) == result
        with pytest.raises(TaskResultDoesNotExist):
            await default_task_backend.aget_result(str(uuid.uuid4()))

    asyncio.run(flow())


def test_arguments_json_cannot_hold_are_refused_at_enqueue_and_nothing_is_written(
        dj_url: str) -> None:
    """Django normalises arguments to JSON when the result is made, before the backend
    writes anything: a value JSON cannot hold fails the caller's enqueue, not the worker."""
    from shop import djtasks

    with pytest.raises(TypeError, match="Unsupported type"):
        djtasks.add.enqueue(timezone.now(), 1)
    with pytest.raises(TypeError, match="Unsupported type"):
        asyncio.run(djtasks.add.aenqueue(1, b=object()))
    assert sql(dj_url, "SELECT count(*) FROM delayed_queue") == [(0,)]


def test_a_task_reads_only_its_own_results(dj_url: str) -> None:
    """``Task.get_result`` is the task's view: another task's result id is a mismatch, not
    that other task's result."""
    from shop import djtasks

    from delayq_transport.django._framework import TaskResultMismatch

    theirs = djtasks.mail_add.enqueue(1, 2)
    assert djtasks.mail_add.get_result(theirs.id) == theirs
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        djtasks.add.get_result(theirs.id)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        asyncio.run(djtasks.add.aget_result(theirs.id))


def test_enqueue_is_validated_against_the_backend_it_lands_on(dj_url: str) -> None:
    """A task made while other settings held (a queue this backend does not list) is refused
    at enqueue, sync and async, as Django's backends refuse it: nothing is written."""
    from shop import djtasks

    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["other"]}}):
        elsewhere = djtasks.add.using(queue_name="other")
    with pytest.raises(InvalidTask, match="Queue 'other' is not valid for backend"):
        elsewhere.enqueue(1, 1)
    with pytest.raises(InvalidTask, match="Queue 'other' is not valid for backend"):
        asyncio.run(elsewhere.aenqueue(1, 1))
    assert sql(dj_url, "SELECT count(*) FROM delayed_queue") == [(0,)]


def test_a_result_that_does_not_exist_raises(dj_url: str) -> None:
    for missing in (str(uuid.uuid4()), 123, ""):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(missing)


def test_run_after_is_kept_to_the_millisecond_and_priority_names_the_kind(dj_url: str) -> None:
    from shop import djtasks

    at = timezone.now().replace(microsecond=123456) + timedelta(hours=1)
    result = djtasks.mail_add.using(priority=-42, run_after=at).enqueue(1, 1)
    kind, scheduled_at, _ = row(dj_url, result.id) or (None, 0, None)
    assert kind == "django:mail:-42"
    # kept to the millisecond, rounded up: never before run_after (123.456 ms -> 124)
    assert scheduled_at == due_ms(at) and scheduled_at % 1000 == 124
    got = default_task_backend.get_result(result.id)
    assert got.task.run_after == at  # to the microsecond, as given
    assert got.task.priority == -42 and got.task.queue_name == "mail"


def test_enqueue_inside_atomic_joins_the_transaction(dj_url: str) -> None:
    from shop import djtasks

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        rolled = djtasks.add.enqueue(1, 1)
        assert row(dj_url, rolled.id) is None  # not visible to anyone else before the commit
        raise Rollback
    assert row(dj_url, rolled.id) is None
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(rolled.id)
    with transaction.atomic():
        kept = djtasks.add.enqueue(2, 2)
        with pytest.raises(Rollback), transaction.atomic():  # a savepoint rolled back
            inner = djtasks.add.enqueue(3, 3)
            raise Rollback
        assert row(dj_url, kept.id) is None
    assert row(dj_url, kept.id) is not None and row(dj_url, inner.id) is None


def test_a_task_enqueued_inside_atomic_is_not_there_before_the_commit_unlike_djangos_backends(
        dj_url: str) -> None:
    """A deliberate difference from Django's DummyBackend and ImmediateBackend, which take a
    task at once even inside ``atomic()`` (their tests: "doesn't wait until transaction
    commit by default"). Delayq writes it in the caller's transaction (``JOIN_ATOMIC``, on by
    default), as django-tasks-db does: until the commit no other connection sees it and no
    worker can run it, so a task never acts on rows its transaction then rolls back.
    ``enqueued_at`` is set at once all the same; ``JOIN_ATOMIC=False`` gives Django's
    behaviour."""
    from shop import djtasks

    with transaction.atomic():
        result = djtasks.add.enqueue(1, 1)
        assert result.enqueued_at is not None
        assert row(dj_url, result.id) is None  # another connection: not there yet
    assert row(dj_url, result.id) is not None
    assert default_task_backend.get_result(result.id) == result
    with override_settings(TASKS=tasks_setting(JOIN_ATOMIC=False)), transaction.atomic():
        at_once = djtasks.add.enqueue(2, 2)
        assert row(dj_url, at_once.id) is not None


def test_outside_atomic_and_with_join_atomic_off_a_task_commits_at_once(dj_url: str) -> None:
    from shop import djtasks

    result = djtasks.add.enqueue(1, 1)
    assert row(dj_url, result.id) is not None
    with override_settings(TASKS=tasks_setting(JOIN_ATOMIC=False)):
        assert task_backends["default"].join_atomic is False
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            alone = djtasks.add.enqueue(2, 2)
            assert row(dj_url, alone.id) is not None  # committed on delayq's connection
            1 / 0  # noqa: B018
    assert row(dj_url, alone.id) is not None  # the rollback did not take it back


def test_task_enqueued_is_sent(dj_url: str) -> None:
    from shop import djtasks

    seen: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append((sender, task_result.id, task_result.status))

    task_enqueued.connect(receiver)
    try:
        result = djtasks.add.enqueue(1, 1)
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [(DelayqBackend, result.id, TaskResultStatus.READY)]


def test_enqueue_logs_one_line_naming_the_task(dj_url: str, caplog: pytest.LogCaptureFixture
                                               ) -> None:
    """Django's receiver of ``task_enqueued`` logs it (``django.tasks``, DEBUG); delayq adds
    nothing to that logger."""
    from shop import djtasks

    with caplog.at_level(logging.DEBUG, logger=SOURCE):
        result = djtasks.add.enqueue(1, 1)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(SOURCE)]
    assert len(lines) == 1 and "enqueued" in lines[0] and result.id in lines[0]


def _messages(backend: DelayqBackend) -> list[tuple[str, str]]:
    return [(m.id or "", m.msg) for m in backend.check()]


def test_check_passes_on_the_project_and_names_a_missing_table(dj_url: str) -> None:
    assert _messages(task_backends["default"]) == []
    assert [m for m in checks.run_checks() if (m.id or "").startswith("delayq")] == []
    missing = DelayqBackend("other", {"OPTIONS": {"TABLE": "dj_missing"}})
    [(code, message)] = _messages(missing)
    assert code == "delayq.W002"
    assert "no delayq tables for table 'dj_missing'" in message and "migrate" in message


def test_check_warns_when_the_app_is_not_installed(dj_url: str) -> None:
    """Without ``delayq_transport.django`` in INSTALLED_APPS the backend enqueues, but there is
    no ``manage.py delayq_worker`` to run its tasks: the check says which app to add."""
    with override_settings(INSTALLED_APPS=["shop"]):
        messages = _messages(task_backends["default"])
    assert [code for code, _ in messages] == ["delayq.W001"]
    assert "'delayq_transport.django' is not in INSTALLED_APPS" in messages[0][1]


def test_check_names_a_wrong_database(dj_url: str) -> None:
    from django.conf import settings as conf

    absent = DelayqBackend("x", {"OPTIONS": {"DATABASE": "nope"}})
    [(code, message)] = _messages(absent)
    assert code == "delayq.E001" and "'nope' is not in DATABASES" in message
    lite = {**conf.DATABASES, "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":m:"}}
    with pytest.warns(UserWarning, match="Overriding setting DATABASES"), \
            override_settings(DATABASES=lite):
        [(code, message)] = _messages(DelayqBackend("x", {"OPTIONS": {"DATABASE": "lite"}}))
    assert code == "delayq.E002" and "sqlite3" in message and "PostgreSQL" in message
    with override_settings(DELAYQ_JOIN_ATOMIC=True, DELAYQ_DATABASE="elsewhere"):
        codes = [c for c, _ in _messages(task_backends["default"])]
    assert codes == ["delayq.E003"]


def test_delayq_tasks_shows_reschedules_and_cancels_a_waiting_task(dj_url: str) -> None:
    """The operator's tools (``delayq tasks``, and the page on the same service) know the
    task's format: its path and arguments, and its ``run_after`` follows a reschedule."""
    from click.testing import CliRunner
    from shop import djtasks

    from delayq_transport.cli import main

    def delayq(*args: str) -> dict[str, Any]:
        done = CliRunner().invoke(main, ["-d", dj_url, "tasks", *args, "--json"])
        assert done.exit_code == 0, done.output
        return dict(json.loads(done.output))

    later = djtasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(2, b=3)
    shown = delayq("show", later.id)
    assert shown["message"]["format"] == "django"
    assert (shown["message"]["task"], shown["message"]["args"]) == ("shop.djtasks.add", [2])
    before = default_task_backend.get_result(later.id).task.run_after
    delayq("reschedule", later.id, "--in", "2h")
    after = default_task_backend.get_result(later.id).task.run_after
    assert after - before > timedelta(minutes=59)
    [(scheduled_at,)] = sql(dj_url, 'SELECT "scheduledAt" FROM delayed_queue')
    assert scheduled_at == to_ms(after)
    delayq("cancel", later.id)
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(later.id)
