"""Real worker processes (``manage.py delayq_worker``): results read by a process that did not
enqueue, graceful shutdown (a running task finishes; given back at the timeout, it runs again
elsewhere: test_interruptions.py), several processes under one parent, crash histories (the
worker killed after it claimed a task, after the task's external effect, after it wrote the
outcome; a ``task_started`` or ``task_finished`` receiver that raises), and counted
concurrency: 4 enqueuing processes, a seeded half of their transactions rolled back, exactly
the committed tasks run, once each (at least once for what a SIGKILLed worker held).

What each crash leaves, as docs/how-to/django-tasks.md states it (a 1.5-s lease here):

================  ==========  =================  =========================================
killed            task ran    final status       why
================  ==========  =================  =========================================
after claiming    1 time      SUCCESSFUL         the lease ends, another worker runs it
after the effect  2 times     SUCCESSFUL         the same: at least once, the effect twice
after the outcome 1 time      SUCCESSFUL         the redelivery finds the outcome: acked only
receiver raises   1 time      SUCCESSFUL         receivers' errors are logged, not the task's
================  ==========  =================  =========================================
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from delayq_transport.django._framework import TaskResult, TaskResultStatus

from .conftest import (
    PROJECT,
    WorkerProcess,
    gate_closed,
    manage,
    project_env,
    row_count,
    runs,
    sql,
    start_gated,
    wait_until,
)
from .conftest import finished as conftest_finished

#: A short lease: a killed worker's task comes back this soon.
SHORT_LEASE = json.dumps({"LEASE": 1.5})


def finished(result: TaskResult, timeout: float = 60) -> TaskResult:
    return conftest_finished(result, timeout)


def test_a_worker_process_runs_tasks_and_another_process_reads_the_results(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    from shop import djtasks

    worker = start_worker("--threads", "2")
    results = [djtasks.add.enqueue(i, i) for i in range(10)] + [djtasks.fail.enqueue("x")]
    for result in results:
        finished(result)
    assert [r.return_value for r in results[:10]] == [2 * i for i in range(10)]
    code = ("from delayq_transport.django._framework import default_task_backend as b; "
            f"r = b.get_result({results[3].id!r}); f = b.get_result({results[-1].id!r}); "
            "print(r.status, r.return_value, f.status, f.errors[0].exception_class_path)")
    out = manage(project_env(dj_url), "shell", "-c", code)  # Django 6 first says what it
    assert out.strip().splitlines()[-1].split() == [  # imported
        "SUCCESSFUL", "6", "FAILED", "builtins.ValueError"]
    assert worker.proc.poll() is None


def test_a_row_that_is_not_a_task_is_a_dead_letter_listed_then_expired(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    """The dead-letter policy (formats/deadletters.py) under a real worker: the row moves to
    ``django.XQ``, is listed beside the other front ends' (``delayq tasks dead-letters``) and
    is deleted by the worker's expiry when ``DEAD_LETTER_RETENTION`` ends, nothing else
    touched."""
    from _dead_letters import bystanders, listed

    from delayq_transport.core.queue import DelayedQueue
    from delayq_transport.formats.django_tasks import kind_of

    left = bystanders(dj_url)
    # 15 s: long enough that a listing (a `delayq` process, seconds on a loaded machine) sees
    # the letter before the expiry (as often as the retention) deletes it.
    worker = start_worker(DJANGO_TASKS_OPTIONS=json.dumps({"DEAD_LETTER_RETENTION": 15}))
    with DelayedQueue(dj_url, kind=kind_of("default", 0), ensure_schema=False) as queue:
        queue.offer("not-a-task", b"[1, 2]")
    [letter] = wait_until(lambda: listed(dj_url, "django.tasks"), "a dead letter", 90)
    assert (letter["kind"], letter["actor"]) == ("django.XQ", None)
    wait_until(lambda: not listed(dj_url, "django.tasks"), "the dead letter expired", 90)
    assert left() == [("bystander", "due-now"), ("dramatiq:kept.XQ", "kept-a-day")]
    assert "moved to kind django.XQ, kept 15 s" in worker.log()


def test_a_worker_waits_for_delayq_migrate_then_runs_tasks(tmp_path: Path) -> None:
    """Started on a database without delayq's tables, its role unable to create them (a
    deploy where the release step runs beside the new workers): it waits, saying so every few
    seconds and naming ``delayq migrate`` and ``manage.py delayq_migrate``, and runs tasks once
    the release step ran (docs/how-to/upgrade.md#a-worker-before-delayq-migrate)."""
    from _pg_roles import before_migrate

    waiting = "waiting for its tables: no delayq tables in database"
    with before_migrate() as (owner, role, release):
        worker = WorkerProcess(project_env(role), tmp_path / "worker.log")
        try:
            wait_until(lambda: worker.log().count(waiting) >= 2, "the line, twice", 60)
            line = next(x for x in worker.log().splitlines() if waiting in x)
            assert "run `delayq migrate` (Django: `manage.py delayq_migrate`)" in line
            assert "giving up in" in line and worker.proc.poll() is None
            release()
            worker.wait_for_log(" ready", timeout=60)
            code = ("from shop import djtasks; r = djtasks.add.enqueue(2, 3); "
                    "print('result', r.id)")
            out = manage(project_env(owner), "shell", "-c", code)
            result_id = out.strip().splitlines()[-1].split()[-1]
            wait_until(lambda: sql(owner, "SELECT status FROM delayq_task_results WHERE "
                                          "id = %s AND status = 'SUCCESSFUL'", [result_id]),
                       "the task ran", 30)
        finally:
            worker.stop()


def test_sigterm_lets_a_running_task_finish(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    with gate_closed(dj_url) as open_gate:
        worker, result = start_gated(start_worker, dj_url, "term", "--shutdown-timeout", "60")
        worker.signal(signal.SIGTERM)
        worker.wait_for_log("stopping")
        open_gate()
        assert worker.wait() == 0
    assert [label for label, *_ in runs(dj_url)] == ["term:start", "term:end"]
    assert finished(result).status == TaskResultStatus.SUCCESSFUL and row_count(dj_url) == 0


# A running task given back at the shutdown timeout, and what its result says: test_interruptions.py


def test_several_processes_under_one_parent(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    from shop import djtasks

    parent = start_worker("--processes", "2", "--threads", "2", ready=2)
    children = [c for c in psutil.Process(parent.proc.pid).children()
                if "spawn_main" in " ".join(c.cmdline())]  # not multiprocessing's tracker
    assert len(children) == 2
    results = [djtasks.record.enqueue(f"p{i}") for i in range(40)]
    for result in results:
        finished(result)
    assert sorted(label for label, *_ in runs(dj_url)) == sorted(f"p{i}" for i in range(40))
    parent.signal(signal.SIGTERM)
    assert parent.wait() == 0
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_several_processes_exit_1_when_one_gave_a_task_back(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    """The command's status does not depend on --processes: one process giving a running task
    back at the shutdown timeout makes the whole command exit 1, as a single worker does."""
    with gate_closed(dj_url):
        parent, _ = start_gated(lambda *a: start_worker(*a, ready=2), dj_url, "held",
                                "--processes", "2", "--shutdown-timeout", "1")
        parent.signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 1


@pytest.mark.parametrize(("mode", "ran", "attempts"), [
    ("claimed", 1, 2), ("effect", 2, 2), ("recorded", 1, 1)])
def test_crash_histories(mode: str, ran: int, attempts: int, dj_url: str,
                         start_worker: Callable[..., WorkerProcess]) -> None:
    from shop import djtasks

    env = {"DJANGO_TASKS_CRASH": mode, "DJANGO_TASKS_OPTIONS": SHORT_LEASE}
    first = start_worker(**env)
    result = djtasks.record.enqueue(mode)
    assert first.wait(timeout=60) == -signal.SIGKILL  # killed itself where the mode says
    start_worker(**env)  # the second worker's attempt is not the first: it does not crash
    finished(result)
    wait_until(lambda: row_count(dj_url) == 0, "the row's ack")
    assert len(runs(dj_url)) == ran
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == attempts
    assert len(set(result.worker_ids)) == attempts


@pytest.mark.parametrize("signal_name", ["started", "finished"])
def test_a_raising_receiver_leaves_the_task_run_once(
        signal_name: str, dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    from shop import djtasks

    worker = start_worker(DJANGO_TASKS_RAISE=signal_name)
    result = finished(djtasks.record.enqueue(signal_name))
    wait_until(lambda: row_count(dj_url) == 0, "the row's ack")
    assert result.status == TaskResultStatus.SUCCESSFUL and len(runs(dj_url)) == 1
    assert worker.proc.poll() is None


def start_producers(dj_url: str, producers: int, count: int) -> list[subprocess.Popen[str]]:
    """``manage.py enqueue_orders`` in ``producers`` processes at once."""
    return [subprocess.Popen(
        [sys.executable, "manage.py", "enqueue_orders", "--count", str(count), "--seed",
         str(seed)], cwd=PROJECT, env=project_env(dj_url), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for seed in range(producers)]


def committed_by(procs: list[subprocess.Popen[str]]) -> list[int]:
    """The order ids the producers committed (each prints its own as JSON)."""
    committed: list[int] = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        committed += json.loads(out.strip().splitlines()[-1])
    return committed


def enqueue_orders(dj_url: str, producers: int, count: int) -> list[int]:
    return committed_by(start_producers(dj_url, producers, count))


def results_by_status(dj_url: str) -> dict[str, int]:
    return {str(s): int(n) for s, n in sql(
        dj_url, 'SELECT status, count(*) FROM delayq_task_results GROUP BY status')}


def test_exactly_the_committed_tasks_run_once_each(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--processes", "2", "--threads", "4", ready=2)
    committed = enqueue_orders(dj_url, producers=4, count=40)
    assert 40 < len(committed) < 120  # the seeds roll back about half of 160
    wait_until(lambda: results_by_status(dj_url).get("SUCCESSFUL") == len(committed),
               "every committed order's task", timeout=120)
    wait_until(lambda: row_count(dj_url) == 0, "the acks")
    labels = sorted(label for label, *_ in runs(dj_url, "order:"))
    assert labels == sorted(f"order:{o}:1" for o in committed)  # once each, order found


def test_after_a_sigkill_every_committed_task_runs_at_least_once(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    doomed = start_worker("--threads", "4", DJANGO_TASKS_OPTIONS=SHORT_LEASE)
    start_worker("--threads", "4", DJANGO_TASKS_OPTIONS=SHORT_LEASE)
    producers = start_producers(dj_url, producers=4, count=40)
    wait_until(lambda: len(runs(dj_url, "order:")) >= 20, "20 tasks run", timeout=120)
    doomed.proc.send_signal(signal.SIGKILL)  # while the producers still enqueue
    assert doomed.wait() == -signal.SIGKILL
    committed = committed_by(producers)
    wait_until(lambda: results_by_status(dj_url).get("SUCCESSFUL") == len(committed),
               "every committed order's task", timeout=120)
    wait_until(lambda: row_count(dj_url) == 0, "the acks")
    assert results_by_status(dj_url) == {"SUCCESSFUL": len(committed)}  # nothing RUNNING
    labels = [label for label, *_ in runs(dj_url, "order:")]
    assert set(labels) == {f"order:{o}:1" for o in committed}
    # Only what the killed worker held (its window: 4 threads) can have run twice.
    assert len(labels) - len(set(labels)) <= 4

