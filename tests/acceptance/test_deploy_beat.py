"""A rolling deploy of Celery beat and its rollback with real processes: two
``celery beat -S delayq_beat.Scheduler`` of different releases (tests/_deploy_ticks.py) and a
``celery worker``, refreshing every second; every tick counted. The new beat is SIGKILLed for
the rollback: its heartbeat lapses, and the old configuration is in force again."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _deploy_ticks import Deploy, by_label

from .conftest import CeleryProcess, executions, wait_until

APP_MODULE = '''
"""Acceptance deploy app: the shared acceptance app with the beat schedule of the release in
DEPLOY_RELEASE, and a task that records the occurrence it runs (its delayq_beat header)."""
import os
from celery_app import app, record

def every(label, task="deploy_beat_app.tick"):
    return {"task": task, "schedule": 1.0, "args": [label],
            "options": {"delayq_misfire": "run_all"}}

RELEASES = {
    "old": {"tick": every("tick"), "changed": every("changed-v1"), "removed": every("removed"),
            "flaky": every("flaky")},
    "new": {"tick": every("tick"), "changed": every("changed-v2"), "added": every("added"),
            "flaky": every("flaky", task="deploy_beat_app.renamed_away")},  # unknown: invalid
}
app.conf.beat_schedule = RELEASES[os.environ["DEPLOY_RELEASE"]]
app.conf.delayq_beat_refresh_interval = 1.0
app.conf.delayq_beat_horizon = 30.0

@app.task(bind=True, name="deploy_beat_app.tick")
def tick(self, label):
    header = self.request.get("delayq_beat") or {}
    record(self.request.id, "deploy", [label, header.get("at_ms")])
'''
REFRESHED = "delayq beat: refreshed"


@pytest.fixture
def start(tmp_path: Path, celery_env: dict[str, str]) -> Iterator[Callable[..., CeleryProcess]]:
    (tmp_path / "deploy_beat_app.py").write_text(textwrap.dedent(APP_MODULE))
    env = dict(celery_env, PYTHONPATH=os.pathsep.join([str(tmp_path), celery_env["PYTHONPATH"]]))
    procs: list[CeleryProcess] = []

    def run(release: str, *args: str, ready: str, name: str) -> CeleryProcess:
        proc = CeleryProcess(["-A", "deploy_beat_app", *args], dict(env, DEPLOY_RELEASE=release),
                             tmp_path / f"{name}.log")
        procs.append(proc)
        proc.wait_for_log(ready, timeout=60)
        return proc

    yield run
    for proc in procs:
        proc.stop()


def runs(database_url: str) -> dict[str, list[int]]:
    found = [json.loads(r["arg"]) for r in executions(database_url, "deploy")]
    assert all(at is not None for _, at in found), "a run without its occurrence header"
    return by_label((label, int(at)) for label, at in found)


@pytest.mark.slow
def test_two_beats_of_two_releases_lose_and_double_no_tick(
        database_url: str, start: Callable[..., CeleryProcess]) -> None:
    deploy = Deploy(lambda: runs(database_url))
    start("old", "worker", "-P", "solo", "--loglevel=INFO", "-n", f"w-{os.getpid()}@%h",
          ready="ready.", name="worker")
    old = start("old", "beat", "-S", "delayq_beat.Scheduler", "--loglevel=INFO",
                ready=REFRESHED, name="beat-old")
    deploy.old_release_alone()
    new = start("new", "beat", "-S", "delayq_beat.Scheduler", "--loglevel=INFO",
                ready=REFRESHED, name="beat-new")
    deploy.new_release_in_force()
    refreshes = old.log().count(REFRESHED)
    wait_until(lambda: old.log().count(REFRESHED) >= refreshes + 3, timeout=30,
               message="the old beat refreshing while the new one is in force")
    assert "is not in force" in old.log()
    new.kill(signal.SIGKILL)  # the rollback: its heartbeat lapses
    deploy.rolled_back("celery beat deploy")
    assert old.proc.poll() is None
