"""A result tells the truth when an attempt is interrupted (delayq_transport/django/attempts.py),
with real worker processes (``manage.py delayq_worker``): what ``get_result`` says while the
task runs, once its worker is killed (SIGKILL at a random point of a running task, and where
the crash hooks of shop/djtasks.py kill it) or gives it back at the end of its shutdown
timeout (SIGTERM), and once another worker ran it again.

A killed worker's task reads READY within the attempt's liveness (a 2-s liveness with the
8-s lease used here), while its row is still leased to the dead worker, with a
``TaskInterrupted`` entry naming the attempt, the worker and the lease's end (when it runs
again); the next worker's claim records that entry for good. A given-back task reads READY
with its entry at once. A task whose outcome was written before the kill stays SUCCESSFUL.
"""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from _captured import capture

from delayq_transport.django._framework import TaskResult, TaskResultStatus
from delayq_transport.formats.django_tasks import INTERRUPTED_PATH

from .conftest import (
    WorkerProcess,
    finished,
    gate_closed,
    runs,
    sql,
    start_gated,
    wait_until,
)

#: The lease: long enough that a killed worker's task is seen interrupted (within its 2-s
#: liveness, a quarter of it) well before the lease lets another worker take it.
LEASE = json.dumps({"LEASE": 8})
HERE = "tests/djtasks/test_interruptions.py"
RUNS_AGAIN = re.compile(r"it runs again from (\S+), when its lease ends")


def worker_id(worker: WorkerProcess) -> str:
    return f"{socket.gethostname()}:{worker.proc.pid}"


def shown(result: TaskResult) -> tuple[str, int, list[tuple[str, str]]]:
    """What a reader sees: status, attempts, and each error (class, last line)."""
    result.refresh()
    out = (str(result.status), result.attempts,
           [(e.exception_class_path.rsplit(".", 1)[-1], e.traceback.strip().splitlines()[-1])
            for e in result.errors])
    print(f"{result.task.name} {result.id[:8]}: {out}")  # the report's stages (pytest -s)
    return out


def lease_end_ms(url: str, key: str) -> tuple[int, str | None]:
    [(at, lock)] = sql(url, 'SELECT "scheduledAt", "lockUuid" FROM delayed_queue '
                            'WHERE "pKey" = %s', [key])
    return int(at), lock


def interrupted(result: TaskResult) -> bool:
    result.refresh()
    return result.status == TaskResultStatus.READY and bool(result.errors)


def assert_seen_killed(url: str, result: TaskResult, worker: str) -> str:
    """READY, one TaskInterrupted entry naming attempt 1 and ``worker``, and the lease's end
    as when it runs again, while the row is still held (the dead worker's lease): the entry's
    line."""
    wait_until(lambda: interrupted(result), "the killed worker's task to read interrupted",
               timeout=6)
    status, attempts, errors = shown(result)
    at, lock = lease_end_ms(url, result.id)
    assert lock is not None and at > time.time() * 1000  # still leased: nothing took it yet
    assert (status, attempts) == ("READY", 1) and len(errors) == 1
    assert result.errors[0].exception_class_path == INTERRUPTED_PATH
    assert result.errors[0].exception_class.__name__ == "TaskInterrupted"
    text = errors[0][1]
    assert text.startswith(f"{INTERRUPTED_PATH}: attempt 1 (worker {worker}) was interrupted: "
                           "its worker stopped: no sign of life by ")
    found = RUNS_AGAIN.search(text)
    assert found is not None, text
    assert datetime.fromisoformat(found.group(1)).timestamp() * 1000 == at
    return text


def assert_ran_again(result: TaskResult, first: str, second: str) -> None:
    """SUCCESSFUL on the second worker, the first attempt recorded as interrupted."""
    status, attempts, errors = shown(finished(result, timeout=60))
    assert (status, attempts) == ("SUCCESSFUL", 2)
    assert result.worker_ids == [first, second]
    [(kind, text)] = errors
    assert kind == "TaskInterrupted"
    assert text.startswith(f"{INTERRUPTED_PATH}: attempt 1 (worker {first}) was interrupted: it "
                           "never settled and its lease ran out")
    assert text.endswith(f" by worker {second}")


def test_sigkill_at_a_random_point_of_a_running_task(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:

    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(0.0, 1.5)
    print(f"seed {seed}: SIGKILL {delay:.3f} s into the task")
    with gate_closed(dj_url) as open_gate:
        doomed, result = start_gated(start_worker, dj_url, "random", DJANGO_TASKS_OPTIONS=LEASE)
        assert shown(result) == ("RUNNING", 1, [])
        time.sleep(delay)  # the kill's point in the task, not a wait for an event
        assert shown(result)[:2] == ("RUNNING", 1)  # still running: its worker touches it
        doomed.proc.send_signal(signal.SIGKILL)
        assert doomed.wait() == -signal.SIGKILL
        assert_seen_killed(dj_url, result, worker_id(doomed))
        open_gate()
        second = start_worker(DJANGO_TASKS_OPTIONS=LEASE)
        assert_ran_again(result, worker_id(doomed), worker_id(second))
    assert [label for label, *_ in runs(dj_url)] == ["random:start", "random:start",
                                                      "random:end"]


@pytest.mark.parametrize("mode", ["claimed", "effect"])
def test_sigkill_at_named_points(mode: str, dj_url: str,
                                 start_worker: Callable[..., WorkerProcess]) -> None:
    from shop import djtasks

    env = {"DJANGO_TASKS_CRASH": mode, "DJANGO_TASKS_OPTIONS": LEASE}
    doomed = start_worker(**env)
    result = djtasks.record.enqueue(mode)
    assert doomed.wait(timeout=60) == -signal.SIGKILL  # killed itself where the mode says
    line = assert_seen_killed(dj_url, result, worker_id(doomed))
    if mode == "claimed":
        capture("task-interrupted-killed", f"{HERE}::test_sigkill_at_named_points[claimed]",
                output=line, replace={worker_id(doomed): "<host>:<pid>"})
    second = start_worker(**env)  # its attempt is the second: it does not crash
    assert_ran_again(result, worker_id(doomed), worker_id(second))


def test_a_kill_after_the_outcome_was_written_leaves_it_successful(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    from shop import djtasks

    env = {"DJANGO_TASKS_CRASH": "recorded", "DJANGO_TASKS_OPTIONS": LEASE}
    doomed = start_worker(**env)
    result = djtasks.record.enqueue("recorded")
    assert doomed.wait(timeout=60) == -signal.SIGKILL
    assert shown(result) == ("SUCCESSFUL", 1, [])
    start_worker(**env)
    wait_until(lambda: not sql(dj_url, "SELECT 1 FROM delayed_queue"), "the redelivery's ack",
               timeout=60)
    assert shown(result) == ("SUCCESSFUL", 1, [])  # acked, not run again: nothing to record


def test_sigterm_gives_back_a_task_that_outlives_the_shutdown_timeout(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:

    with gate_closed(dj_url) as open_gate:
        first, result = start_gated(start_worker, dj_url, "given-back", "--shutdown-timeout",
                                    "0.5")
        assert shown(result) == ("RUNNING", 1, [])
        first.signal(signal.SIGTERM)
        assert first.wait() == 1  # exited with the task unfinished
        status, attempts, errors = shown(result)  # at once: the worker recorded it
        assert (status, attempts) == ("READY", 1)
        [(kind, text)] = errors
        assert kind == "TaskInterrupted"
        head = f"{INTERRUPTED_PATH}: attempt 1 (worker {worker_id(first)}) was given back "
        found = re.fullmatch(
            rf"{re.escape(head)}unfinished at (\S+): its worker shut down and its shutdown "
            r"timeout \(0\.5 s\) ran out; it runs again from (\S+), on the first free worker",
            text)
        assert found is not None, text
        assert found.group(1) == found.group(2)  # released to be due at once
        capture("task-interrupted-given-back",
                f"{HERE}::test_sigterm_gives_back_a_task_that_outlives_the_shutdown_timeout",
                output=text, replace={worker_id(first): "<host>:<pid>"})
        at, lock = lease_end_ms(dj_url, result.id)
        assert lock is None and at <= time.time() * 1000  # given back, due now
        second = start_worker()
        wait_until(lambda: len(runs(dj_url)) == 2, "the second start")
        assert shown(result)[:2] == ("RUNNING", 2)
        open_gate()
    status, attempts, after = shown(finished(result))
    assert (status, attempts, after) == ("SUCCESSFUL", 2, errors)  # the entry stays
    assert result.worker_ids == [worker_id(first), worker_id(second)]
    assert [label for label, *_ in runs(dj_url)] == [
        "given-back:start", "given-back:start", "given-back:end"]
