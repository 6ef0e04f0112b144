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
from _deploy_ticks import assert_deploy_and_rollback, by_label, counts

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
    old = start_worker("--threads", "2", DJANGO_TASKS_OPTIONS=options("old"))

    def wait(cond: Callable[[dict[str, list[int]]], bool], what: str) -> None:
        wait_until(lambda: cond(deploy_runs(dj_url)), what, timeout=60)

    wait(lambda r: len(r["tick"]) >= 3 and len(r["changed-v1"]) >= 3, "the old release")
    new = start_worker("--threads", "2", DJANGO_TASKS_OPTIONS=options("new"))
    wait(lambda r: len(r["changed-v2"]) >= 5, "the new release in force")
    assert "is not in force" in old.log()
    new.signal(signal.SIGTERM)  # the rollback: its scheduler retires
    assert new.wait() == 0
    stopped_v2 = max(deploy_runs(dj_url)["changed-v2"])
    wait(lambda r: len([t for t in r["changed-v1"] if t > stopped_v2]) >= 4
         and any(t > stopped_v2 for t in r["removed"]), "the old release in force again")
    found = deploy_runs(dj_url)
    print("django.tasks deploy, runs per label:", counts(found))
    assert_deploy_and_rollback(found)
    assert old.proc.poll() is None
