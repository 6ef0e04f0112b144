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

from .conftest import WorkerProcess, runs, wait_until


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


@pytest.mark.slow
def test_a_worker_whose_periodic_holds_only_a_broken_entry_takes_nothing_over(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    """The trial of issue 50: a second worker whose PERIODIC held only an invalid entry
    uninstalled the first one's entry ("entry 'sweep' is gone ... uninstalled"), and its ticks
    were lost until the first worker's next refresh. A configuration without a valid entry
    takes nothing over: every tick of sweep runs once, over several refreshes of both."""
    def sweep() -> list[int]:
        return sorted(int(result_id.rsplit("/", 1)[1]) for label, result_id, _, _ in runs(dj_url)
                      if label == "sweep")

    first = start_worker("--threads", "2", DJANGO_TASKS_OPTIONS=json.dumps(
        {"PERIODIC": {"sweep": every("sweep")}, "PERIODIC_REFRESH": 1}))
    wait_until(lambda: len(sweep()) >= 3, "sweep's ticks", timeout=60)
    second = start_worker("--threads", "2", DJANGO_TASKS_OPTIONS=json.dumps(
        {"PERIODIC": {"typo": every("typo", "shop.djtasks.renamed_away")},
         "PERIODIC_REFRESH": 1}))
    second.wait_for_log("is not in force")
    since = len(sweep())
    wait_until(lambda: len(sweep()) >= since + 6, "six more ticks with both workers", timeout=60)
    ticks = sweep()
    print("django.tasks, one broken entry beside sweep: sweep ran", len(ticks), "ticks")
    assert ticks == list(range(ticks[0], ticks[-1] + 1000, 1000)), "a tick lost or doubled"
    assert "is gone" not in second.log() and "is gone" not in first.log()
