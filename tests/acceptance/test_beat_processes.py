"""Real `celery beat -S delayq_beat.Scheduler` processes with a real worker on the delayq broker."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from delayq_beat.installer import occurrence_task_id

from .conftest import CeleryProcess, executions, wait_until

APP_MODULE = '''
"""Acceptance beat app: the shared acceptance app plus a beat schedule from the environment."""
import json, os
from celery_app import app  # noqa: F401  (its `mark` task records every execution)

app.conf.beat_schedule = json.loads(os.environ["BEAT_SCHEDULE"])
app.conf.delayq_beat_refresh_interval = float(os.environ.get("BEAT_REFRESH", "2"))
app.conf.delayq_beat_horizon = float(os.environ.get("BEAT_HORIZON", "30"))
'''

TICK = {"tick": {"task": "celery_app.mark", "schedule": 1.0, "args": ["tick"],
                 "options": {"delayq_misfire": "run_all"}}}


@pytest.fixture
def start(tmp_path: Path, celery_env: dict[str, str]) -> Iterator[Callable[..., CeleryProcess]]:
    (tmp_path / "beat_accept_app.py").write_text(textwrap.dedent(APP_MODULE))
    env = dict(celery_env, BEAT_SCHEDULE=json.dumps(TICK),
               PYTHONPATH=os.pathsep.join([str(tmp_path), celery_env["PYTHONPATH"]]))
    procs: list[CeleryProcess] = []

    def run(*args: str, ready: str | None, name: str,
            extra_env: dict[str, str] | None = None) -> CeleryProcess:
        """Start a process; wait for its ``ready`` line unless None (the caller waits)."""
        proc = CeleryProcess(["-A", "beat_accept_app", *args], dict(env, **(extra_env or {})),
                             tmp_path / f"{name}-{len(procs)}.log")
        procs.append(proc)
        if ready is not None:
            proc.wait_for_log(ready, timeout=60)
        return proc

    yield run
    for proc in procs:
        proc.stop()


BEAT_READY = "delayq beat: refreshed"
#: What a healthy process never logs.
TROUBLE = ("ERROR", "CRITICAL", "Traceback", "refresh failed")


def beat(start: Callable[..., CeleryProcess], scheduler: str = "delayq_beat.Scheduler",
         name: str = "beat", ready: str | None = BEAT_READY,
         extra_env: dict[str, str] | None = None) -> CeleryProcess:
    return start("beat", "-S", scheduler, "--loglevel=INFO", ready=ready, name=name,
                 extra_env=extra_env)


def assert_healthy(proc: CeleryProcess) -> None:
    """Still running, and nothing in its log says a refresh or a task failed."""
    log = proc.log()
    assert proc.proc.poll() is None, f"{proc.log_path.name} exited:\n{log[-3000:]}"
    trouble = [line for line in log.splitlines() if any(t in line for t in TROUBLE)]
    assert not trouble, f"{proc.log_path.name}:\n" + "\n".join(trouble[:20])


def worker(start: Callable[..., CeleryProcess]) -> CeleryProcess:
    return start("worker", "-P", "solo", "--loglevel=INFO", "-n", f"w-{os.getpid()}@%h",
                 ready="ready.", name="worker")


def occurrence_ms_of_runs(database_url: str) -> list[int]:
    """Map each executed task id back to its occurrence (task id = uuid5 of the key)."""
    with psycopg.connect(database_url) as conn:
        (hash_,), = conn.execute(
            'SELECT "configHash" FROM delayq_schedule_installed WHERE name = %s',
            ("tick",)).fetchall()
        (now_ms,), = conn.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchall()
    start_s = now_ms // 1000 - 300
    by_id = {occurrence_task_id(f"tick/{hash_}/{s * 1000}"): s * 1000
             for s in range(start_s, start_s + 400)}
    ids = [row["task_id"] for row in executions(database_url, "mark")]
    unknown = [i for i in ids if i not in by_id]
    assert not unknown, f"executions that are not occurrences of 'tick': {unknown}"
    return sorted(by_id[i] for i in ids)


def assert_contiguous_once(ms: list[int], at_least: int) -> None:
    assert len(ms) == len(set(ms)), f"duplicate runs: {sorted(m for m in ms if ms.count(m) > 1)}"
    assert ms == list(range(ms[0], ms[-1] + 1, 1000)), f"gaps in {ms}"
    assert len(ms) >= at_least


def installed_until_ms(database_url: str) -> int:
    """The latest occurrence of 'tick' installed so far (its key ends in the occurrence ms)."""
    with psycopg.connect(database_url) as conn:
        keys = [k for (k,) in conn.execute(
            """SELECT "pKey" FROM delayed_queue WHERE "pKey" LIKE 'tick/%%'""").fetchall()]
    assert keys, "no occurrence of 'tick' installed"
    return max(int(k.rsplit("/", 1)[1]) for k in keys)


@pytest.mark.slow
def test_two_beats_every_tick_runs_exactly_once(
    database_url: str, start: Callable[..., CeleryProcess]
) -> None:
    """Two beats at once, racing to install the same occurrences, each run exactly once; and
    the second one is not idle: the first dies early, and the ticks past the last occurrence
    it could have installed (a horizon of 3 s) only run because the second installs them."""
    short = {"BEAT_REFRESH": "1", "BEAT_HORIZON": "3"}
    worker(start)
    first = beat(start, ready=None, extra_env=short)
    # The celery.beat_schedulers entry point, started at the same moment.
    second = beat(start, scheduler="delayq", name="beat-alias", ready=None, extra_env=short)
    for proc in (first, second):
        proc.wait_for_log(BEAT_READY, timeout=60)
    wait_until(lambda: len(executions(database_url, "mark")) >= 5, timeout=40,
               message="5 ticks with both beats running")
    for proc in (first, second):
        wait_until(lambda p=proc: p.log().count(BEAT_READY) >= 3, timeout=20,  # type: ignore[misc]
                   message=f"{proc.log_path.name} refreshing")
        assert_healthy(proc)
    first.kill(signal.SIGKILL)
    first_until = installed_until_ms(database_url)  # nothing later can be the first's
    wait_until(lambda: sum(ms > first_until for ms in occurrence_ms_of_runs(database_url)) >= 4,
               timeout=40, message="4 ticks past what the first beat installed")
    assert_healthy(second)
    assert not [ln for ln in first.log().splitlines() if any(t in ln for t in TROUBLE)]
    assert_contiguous_once(occurrence_ms_of_runs(database_url), at_least=9)


@pytest.mark.slow
def test_ticks_inside_the_horizon_run_after_beat_stops(
    database_url: str, start: Callable[..., CeleryProcess]
) -> None:
    b = beat(start)
    b.kill(signal.SIGKILL)  # no beat from here on
    worker(start)
    wait_until(lambda: len(executions(database_url, "mark")) >= 8, timeout=40,
               message="8 ticks with no beat running")
    assert_contiguous_once(occurrence_ms_of_runs(database_url), at_least=8)
