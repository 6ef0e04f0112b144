"""django.tasks' periodic tasks where schedules are shown, and folded where tasks are listed:
``delayq beat list`` (a ``delayq`` process, which imports no Django) and the page's ``/beat``
show them under their ledger's title with their task and next occurrences, where both said
"No beat entries"; ``delayq tasks list`` shows one line per periodic entry (its next
occurrence) beside the other tasks, ``--all-occurrences`` every installed one, and
``--beat-entry`` one entry's all."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from delayq_transport.django._framework import task_backends
from delayq_transport.django.periodic import Scheduler
from delayq_transport.django.tasks import DelayqBackend
from delayq_transport.formats.django_tasks import PERIODIC_TITLE

from .conftest import PROJECT, project_env

ENTRIES = {"tick": {"task": "shop.djtasks.record", "every": 60, "args": ["tick"]},
           "sweep": {"task": "shop.djtasks.add", "every": 900, "args": [1, 2]}}
#: Occurrences an hour ahead: tick every minute, sweep every quarter of an hour.
TICKS, SWEEPS = 60, 4


@pytest.fixture
def installed(dj_url: str) -> Iterator[str]:
    """The entries installed as a worker's scheduler installs them, and one plain task."""
    backend = task_backends["default"]
    assert isinstance(backend, DelayqBackend)
    store = backend.store()
    report = Scheduler(store.db, store.queue, ENTRIES).refresh()
    assert not report.errors
    from shop import djtasks

    yield djtasks.add.enqueue(3, 4).id


def delayq(url: str, *args: str) -> str:
    """A ``delayq`` process's output (a terminal wide enough for a table's rows)."""
    done = subprocess.run([sys.executable, "-m", "delayq_transport", "-d", url, *args],
                          cwd=PROJECT, env=project_env(url, COLUMNS="300"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_beat_list_shows_them_under_their_ledger(dj_url: str, installed: str) -> None:
    listed = json.loads(delayq(dj_url, "beat", "list", "--json"))
    assert listed["entries"] == []  # Celery beat's own: none
    entries = {e["name"]: e for e in listed["ledgers"][PERIODIC_TITLE]}
    assert sorted(entries) == ["sweep", "tick"]
    assert entries["tick"]["task"] == "shop.djtasks.record"
    assert entries["tick"]["kind"] == "django:default:0"
    assert len(entries["tick"]["upcoming"]) == 3 and entries["sweep"]["upcoming"]
    text = delayq(dj_url, "beat", "list")
    assert f"{PERIODIC_TITLE} (times UTC)" in text and "shop.djtasks.record" in text


def test_the_page_shows_them(dj_url: str, installed: str) -> None:
    from starlette.testclient import TestClient

    from delayq_transport.web.app import create_app
    from delayq_transport.web.security import WebConfig

    backend = task_backends["default"]
    assert isinstance(backend, DelayqBackend)
    client = TestClient(create_app(backend.store().queue, WebConfig()),
                        base_url="http://127.0.0.1:8377")
    entries = client.get("/api/beat").json()["entries"]
    assert {(e["name"], e["ledger"], e["task"]) for e in entries} == {
        ("tick", PERIODIC_TITLE, "shop.djtasks.record"),
        ("sweep", PERIODIC_TITLE, "shop.djtasks.add")}
    page = client.get("/beat").text
    assert "No periodic entries" not in page and PERIODIC_TITLE in page
    assert "shop.djtasks.record" in page and "/beat/disable" not in page  # not beat's to toggle


def test_tasks_list_folds_each_entrys_occurrences_into_one_line(
        dj_url: str, installed: str) -> None:
    def keys(*args: str) -> tuple[list[str], list[str]]:
        page = json.loads(delayq(dj_url, "tasks", "list", "-n", "500", "--json", *args))
        return [t["key"] for t in page["tasks"]], page["folded_entries"]

    folded, names = keys()
    assert names == ["sweep", "tick"]
    assert len(folded) == 3 and installed in folded  # the task, and each entry's next one
    [tick] = [k for k in folded if k.startswith("tick/")]
    everything, none = keys("--all-occurrences")
    assert none == [] and len(everything) == 1 + TICKS + SWEEPS
    assert tick == min(k for k in everything if k.startswith("tick/"))  # the next one
    ticks, none = keys("--beat-entry", "tick")
    assert none == [] and len(ticks) == TICKS
    text = delayq(dj_url, "tasks", "list")
    assert "later occurrences of periodic entries folded (sweep, tick): --all-occurrences " \
           "lists them" in text
    assert "shop.djtasks.record (periodic tick: next)" in text, text
