"""A rolling deploy of django.tasks' periodic tasks and its rollback with real processes: two
``manage.py delayq_worker`` of different releases (their ``OPTIONS["PERIODIC"]``, the schedule
of tests/_deploy_ticks.py), each refreshing every second and running the ticks; every tick
counted by its result id (``<entry>/<hash>/<occurrence ms>``). The new worker gets SIGTERM for
the rollback: its scheduler retires, the old configuration is in force again."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

import pytest
from _deploy_ticks import Deploy, by_label

from .conftest import WorkerProcess, runs


def every(label: str, task: str = "shop.djtasks.record") -> dict[str, Any]:
    return {"task": task, "every": 1, "args": [label], "misfire": "run_all"}


RELEASES = {
    "old": {"tick": every("tick"), "changed": every("changed-v1"), "removed": every("removed"),
            "flaky": every("flaky")},
    "new": {"tick": every("tick"), "changed": every("changed-v2"), "added": every("added"),
            "flaky": every("flaky", "shop.djtasks.renamed_away")},  # cannot be imported
}


def options(release: str) -> str:
    return json.dumps({"PERIODIC": RELEASES[release], "PERIODIC_REFRESH": 1})


def deploy_runs(url: str) -> dict[str, list[int]]:
    return by_label((label, int(result_id.rsplit("/", 1)[1]))
                    for label, result_id, _, _ in runs(url))


@pytest.mark.slow
def test_two_workers_of_two_releases_lose_and_double_no_tick(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    deploy = Deploy(lambda: deploy_runs(dj_url))
    old = start_worker("--threads", "2", DJANGO_TASKS_OPTIONS=options("old"))
    deploy.old_release_alone()
    new = start_worker("--threads", "2", DJANGO_TASKS_OPTIONS=options("new"))
    deploy.new_release_in_force()
    assert "is not in force" in old.log()
    new.signal(signal.SIGTERM)  # the rollback: its scheduler retires
    assert new.wait() == 0
    deploy.rolled_back("django.tasks deploy")
    assert old.proc.poll() is None
