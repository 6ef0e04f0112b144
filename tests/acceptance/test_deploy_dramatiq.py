"""A rolling deploy of Dramatiq's periodic actors and its rollback with real processes: two
``dramatiq`` workers of different releases (tests/_deploy_ticks.py, declared in
_dramatiq_deploy.py), each running a scheduler that refreshes every second
(``PeriodicMiddleware``) and consuming the ticks; every tick counted. The new worker gets
SIGTERM for the rollback: its scheduler retires, the old configuration is in force again."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from _deploy_ticks import Deploy, by_label

from .test_dramatiq_worker import DramatiqWorker, app_env, runs, start_worker  # noqa: F401

WORKER = ("_dramatiq_deploy", "-p", "1", "-t", "2", "--queues", "ticks", "deploy")


def deploy_runs(database_url: str) -> dict[str, list[int]]:
    found = []
    for actor, tag, *_ in runs(database_url):
        if actor == "every_second":
            found.append(("tick", int(tag)))
        elif actor == "deploy_tick":
            label, at = tag.rsplit(":", 1)
            found.append((label, int(at)))
    return by_label(found)


@pytest.mark.slow
def test_two_workers_of_two_releases_lose_and_double_no_tick(
        database_url: str, start_worker: Callable[..., DramatiqWorker]) -> None:  # noqa: F811
    deploy = Deploy(lambda: deploy_runs(database_url))
    old = start_worker(*WORKER, env={"DELAYQ_PERIODIC": "1", "DEPLOY_RELEASE": "old"})
    deploy.old_release_alone()
    new = start_worker(*WORKER, env={"DELAYQ_PERIODIC": "1", "DEPLOY_RELEASE": "new"})
    deploy.new_release_in_force()
    assert "is not in force" in old.log()
    new.kill(signal.SIGTERM)  # the rollback: its scheduler retires
    deploy.rolled_back("dramatiq deploy")
    assert old.proc.poll() is None
