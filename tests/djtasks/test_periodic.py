"""Periodic tasks of django.tasks (delayq_transport/django/periodic.py): declared in the
backend's OPTIONS, installed ahead by every worker's scheduler, each occurrence run once
however many workers schedule, its result found by its key; a bad entry is named by check()
and skipped, not fatal."""

from __future__ import annotations

from datetime import UTC, datetime

from delayq_transport.django._framework import TaskResultStatus, default_task_backend
from delayq_transport.django.tasks import DelayqBackend

from .conftest import finished, running, runs, sql, wait_until

TICK = {"tick": {"task": "shop.djtasks.record", "every": 1, "args": ["tick"]}}


def test_each_occurrence_runs_once_with_two_schedulers(dj_url: str) -> None:
    with running(PERIODIC=TICK), running(PERIODIC=TICK):
        wait_until(lambda: len(runs(dj_url, "tick")) >= 3, "three occurrences", timeout=30)
    ran = runs(dj_url, "tick")
    ids = [result_id for _, result_id, _, _ in ran]
    assert len(ids) == len(set(ids))  # no occurrence twice
    times = sorted(int(i.rsplit("/", 1)[1]) for i in ids)  # <entry>/<hash>/<epoch ms>
    assert all(t % 1000 == 0 for t in times)  # aligned on the epoch, every second
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [1000] * (len(times) - 1)
    result = finished(default_task_backend.get_result(ids[0]))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "tick"
    at = datetime.fromtimestamp(int(ids[0].rsplit("/", 1)[1]) / 1000, UTC)
    assert result.task.run_after == at and result.enqueued_at == at
    # Installed ahead: the next occurrences wait as rows of the task's kind.
    waiting = sql(dj_url, 'SELECT count(*) FROM delayed_queue WHERE "pKind" = '
                          "'django:default:0' AND \"pKey\" LIKE 'tick/%%'")[0][0]
    assert waiting >= 3


def test_a_bad_entry_is_named_by_check_and_skipped(dj_url: str) -> None:
    entries = {**TICK, "broken": {"task": "shop.djtasks.nope", "every": 5},
               "both": {"task": "shop.djtasks.add", "every": 5, "cron": "* * * * *"}}
    backend = DelayqBackend("x", {"QUEUES": ["default"], "OPTIONS": {"PERIODIC": entries}})
    messages = {m.msg.split(":")[1].strip(): m.id for m in backend.check()}
    assert messages == {"OPTIONS PERIODIC 'broken'": "delayq.E005",
                        "OPTIONS PERIODIC 'both'": "delayq.E005"}
    with running(PERIODIC=entries):
        wait_until(lambda: runs(dj_url, "tick"), "the good entry's first run", timeout=30)
