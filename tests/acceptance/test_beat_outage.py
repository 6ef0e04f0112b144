"""Real ``celery beat -S delayq_beat.Scheduler`` processes and real workers through an outage of
every beat (and the worker) longer than the horizon, as Dramatiq's periodic actors go through
theirs (test_dramatiq_worker.py): the misfire policy decides what runs of the occurrences no
beat installed, exactly once with several beats restarted together, and a worker back before
any beat drops the late occurrences a newer one superseded.

A three-second schedule with a three-second horizon and half a second of grace keeps it short;
the beats of the restart wait on a gate file, so the test opens it at the instant it chooses.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from delayq_transport.scheduling.plans import occurrence_task_id

from .conftest import CeleryProcess, executions, wait_until

PERIOD_S = 3
GRACE_S = 0.5
POLICIES = ("coalesce", "skip", "run_all")

APP_MODULE = '''
"""Outage test app: the shared acceptance app, three entries (one per misfire policy), and a
Scheduler that, given BEAT_GATE, waits for that file before its first refresh."""
import json, os, time
from celery_app import app  # noqa: F401  (its `mark` task records every execution)
import delayq_beat

period, grace = float(os.environ["BEAT_PERIOD"]), float(os.environ["BEAT_GRACE"])
app.conf.beat_schedule = {
    policy: {"task": "celery_app.mark", "schedule": period, "args": [policy],
             "options": {"delayq_misfire": policy, "delayq_grace": grace}}
    for policy in json.loads(os.environ["BEAT_POLICIES"])}
app.conf.delayq_beat_refresh_interval = 1.0
app.conf.delayq_beat_horizon = period
app.conf.delayq_beat_min_occurrences = 1


class GatedScheduler(delayq_beat.Scheduler):
    def setup_schedule(self):
        super().setup_schedule()
        gate = os.environ.get("BEAT_GATE")
        if gate:
            print("beat gate: waiting", flush=True)
            while not os.path.exists(gate):
                time.sleep(0.005)
'''


@pytest.fixture
def start(tmp_path: Path, celery_env: dict[str, str]) -> Iterator[Callable[..., CeleryProcess]]:
    (tmp_path / "beat_outage_app.py").write_text(textwrap.dedent(APP_MODULE))
    env = dict(celery_env, PYTHONPATH=os.pathsep.join([str(tmp_path), celery_env["PYTHONPATH"]]),
               BEAT_PERIOD=str(PERIOD_S), BEAT_GRACE=str(GRACE_S),
               BEAT_POLICIES=json.dumps(POLICIES))
    procs: list[CeleryProcess] = []

    def run(*args: str, name: str, extra_env: dict[str, str] | None = None) -> CeleryProcess:
        proc = CeleryProcess(["-A", "beat_outage_app", *args], dict(env, **(extra_env or {})),
                             tmp_path / f"{name}-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        proc.stop()


def beats(start: Callable[..., CeleryProcess], n: int, gate: Path | None = None
          ) -> list[CeleryProcess]:
    """``n`` beats started together; ready once refreshed, or (gated) waiting at the gate."""
    extra = {"BEAT_GATE": str(gate)} if gate else {}
    procs = [start("beat", "-S", "beat_outage_app.GatedScheduler", "--loglevel=INFO",
                   name=f"beat{i}", extra_env=extra) for i in range(n)]
    for proc in procs:
        proc.wait_for_log("beat gate: waiting" if gate else "delayq beat: refreshed", timeout=90)
    return procs


def worker(start: Callable[..., CeleryProcess], name: str) -> CeleryProcess:
    proc = start("worker", "-P", "solo", "--loglevel=INFO", "-n", f"{name}-{os.getpid()}@%h",
                 name=name)
    proc.wait_for_log("ready.", timeout=90)
    return proc


def now_ms() -> int:
    return int(time.time() * 1000)


class Runs:
    """Executions of the ``mark`` task mapped back to (entry, occurrence ms) by task id."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        with psycopg.connect(database_url) as conn:
            hashes = dict(conn.execute(
                'SELECT name, "configHash" FROM delayq_schedule_installed '
                "WHERE \"tableName\" = 'delayed_queue' AND name = ANY(%s)",
                (list(POLICIES),)).fetchall())
        assert set(hashes) == set(POLICIES), hashes
        start = (now_ms() // 1000 - 600) // PERIOD_S * PERIOD_S * 1000
        self.by_id = {occurrence_task_id(f"{p}/{hashes[p]}/{ms}"): (p, ms)
                      for p in POLICIES
                      for ms in range(start, start + 1800_000, PERIOD_S * 1000)}

    def all(self) -> list[tuple[str, int, float]]:
        """(entry, occurrence ms, ran at ms) of every execution so far."""
        out = []
        for row in executions(self.url, "mark"):
            assert row["task_id"] in self.by_id, f"not an occurrence: {row}"
            entry, ms = self.by_id[row["task_id"]]
            assert json.loads(row["arg"]) == entry
            out.append((entry, ms, row["ran_at"].timestamp() * 1000))
        return out

    def of(self, policy: str) -> list[int]:
        return [ms for entry, ms, _ in self.all() if entry == policy]


def waiting(database_url: str) -> dict[str, list[int]]:
    """Occurrences still in the table, per entry."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute('SELECT split_part("pKey", \'/\', 1), "scheduledAtInitially" '
                            "FROM delayed_queue WHERE \"pKind\" = 'celery'").fetchall()
    found: dict[str, list[int]] = {p: [] for p in POLICIES}
    for entry, at in rows:
        if entry in found:  # not Celery's own celery.backend_cleanup
            found[entry].append(int(at))
    return {p: sorted(v) for p, v in found.items()}


def installed_until(database_url: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        return dict(conn.execute('SELECT name, "installedUntil" FROM delayq_schedule_installed '
                                 "WHERE \"tableName\" = 'delayed_queue' AND name = ANY(%s)",
                                 (list(POLICIES),)).fetchall())


@pytest.mark.slow
def test_beats_and_worker_down_past_the_horizon_catch_up_once_by_policy(
        database_url: str, start: Callable[..., CeleryProcess], tmp_path: Path) -> None:
    period_ms = PERIOD_S * 1000
    first_worker = worker(start, "w1")
    running = beats(start, 3)
    runs = Runs(database_url)
    wait_until(lambda: all(len(runs.of(p)) >= 2 for p in POLICIES), 40, 0.1, "ticks")

    # The outage: the worker, then every beat. What they installed waits in the table.
    first_worker.stop()
    for b in running:
        b.kill(signal.SIGKILL)
    until = installed_until(database_url)
    assert len(set(until.values())) == 1, until
    gap_start = until["coalesce"]
    stale = waiting(database_url)
    # A beat killed inside a refresh may have written an occurrence its ledger row does not
    # record yet (the rows, then the ledger): at most one period past it, caught up by key.
    assert all(max(v, default=gap_start) <= gap_start + period_ms for v in stale.values()), stale
    assert stale["run_all"] and stale["coalesce"], "nothing left installed for the worker"
    wait_until(lambda: now_ms() > gap_start + 2 * period_ms + 1000, 30, 0.05,
               "an outage two occurrences past the horizon")

    # A worker comes back before any beat: under coalesce every stale occurrence was
    # superseded by a newer one (never installed), under skip all are late: only run_all's run.
    worker(start, "w2")
    wait_until(lambda: all(v == [] for v in waiting(database_url).values()), 40, 0.1,
               "the stale rows handled")
    assert set(runs.of("run_all")) >= set(stale["run_all"])
    assert set(runs.of("coalesce")) & set(stale["coalesce"]) == set()
    assert set(runs.of("skip")) & set(stale["skip"]) == set()
    assert [ms for p in ("coalesce", "skip") for ms in runs.of(p) if ms > gap_start] == []

    # Three beats restarted at one instant, chosen so the gap's newest occurrence is more
    # than grace late and the next one more than min_lead (1 s) ahead.
    gate = tmp_path / "gate"
    restarted = beats(start, 3, gate)
    wait_until(lambda: 1000 <= now_ms() % period_ms <= 1400, 10, 0.005, "the restart instant")
    restart_ms = now_ms()
    gate.touch()
    newest_missed = restart_ms - restart_ms % period_ms
    assert newest_missed >= gap_start + 2 * period_ms
    for b in restarted:
        b.wait_for_log("delayq beat: refreshed", timeout=30)
    wait_until(lambda: all(sum(ms > restart_ms + 1000 for ms in runs.of(p)) >= 2
                           for p in POLICIES), 40, 0.1, "ticks after the restart")

    gap = {p: [ms for ms in runs.of(p) if gap_start < ms <= restart_ms + 1000]
           for p in POLICIES}
    assert gap["coalesce"] == [newest_missed]
    assert gap["skip"] == []
    assert sorted(gap["run_all"]) == list(range(gap_start + period_ms, newest_missed + 1,
                                                period_ms))
    [ran_at] = [at for entry, ms, at in runs.all() if (entry, ms) == ("coalesce", newest_missed)]
    assert ran_at - restart_ms < 10_000, "the catch-up did not run at the restart"
    for p in POLICIES:
        assert len(runs.of(p)) == len(set(runs.of(p))), f"a {p} occurrence ran twice"
    every = sorted(runs.of("run_all"))  # run_all: every occurrence once, late or not
    assert every == list(range(every[0], every[-1] + 1, period_ms))
