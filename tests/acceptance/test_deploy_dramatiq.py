"""A rolling deploy of Dramatiq's periodic actors and its rollback with real processes: two
``dramatiq`` workers of different releases (tests/_deploy_ticks.py, declared in
_dramatiq_deploy.py), each running a scheduler that refreshes every second
(``PeriodicMiddleware``) and consuming the ticks; every tick counted. The new worker gets
SIGTERM for the rollback: its scheduler retires, the old configuration is in force again."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from _deploy_ticks import assert_deploy_and_rollback, by_label, counts

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
    old = start_worker(*WORKER, env={"DELAYQ_PERIODIC": "1", "DEPLOY_RELEASE": "old"})
    wait = _waiter(database_url)
    wait(lambda r: len(r["tick"]) >= 3 and len(r["changed-v1"]) >= 3, "the old release")
    new = start_worker(*WORKER, env={"DELAYQ_PERIODIC": "1", "DEPLOY_RELEASE": "new"})
    wait(lambda r: len(r["changed-v2"]) >= 5, "the new release in force")
    assert "is not in force" in old.log()
    new.kill(signal.SIGTERM)  # the rollback: its scheduler retires
    stopped_v2 = max(deploy_runs(database_url)["changed-v2"])
    wait(lambda r: len([t for t in r["changed-v1"] if t > stopped_v2]) >= 4
         and any(t > stopped_v2 for t in r["removed"]), "the old release in force again")
    found = deploy_runs(database_url)
    print("dramatiq deploy, runs per label:", counts(found))
    assert_deploy_and_rollback(found)
    assert old.proc.poll() is None


def _waiter(database_url: str) -> Callable[[Callable[[dict[str, list[int]]], bool], str], None]:
    from .test_dramatiq_worker import wait_for

    def wait(cond: Callable[[dict[str, list[int]]], bool], what: str) -> None:
        wait_for(lambda: cond(deploy_runs(database_url)), 60, what)

    return wait
