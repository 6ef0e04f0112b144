"""Celery beat after an outage of every beat longer than the horizon (injected clock): the
misfire policy applies to the occurrences no beat installed, exactly once however many beats
restart together, and a worker back first drops what a newer occurrence superseded."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from test_beat_installer import T0, Clock  # beat's tests' injected clock

from delayq_beat import BeatStore, Installer, Settings, drop_misfired, make_spec
from delayq_transport import DelayedQueue
from delayq_transport.core.queue import from_ms, to_ms
from delayq_transport.formats import celery as message

MINUTE = timedelta(minutes=1)
#: Every beat is down from T0 (horizon: ten minutes, T0+1m..T0+10m) to here.
RESTART = T0 + 30 * MINUTE + timedelta(seconds=30)
SETTINGS = Settings(refresh_interval=MINUTE, horizon=10 * MINUTE)
POLICIES = ("coalesce", "skip", "run_all")
#: What each policy runs of the gap T0+11m..T0+30m (minutes after T0).
GAP_RUNS = {"coalesce": [30], "skip": [], "run_all": list(range(11, 31))}


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def queue(database_url: str, clock: Clock) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind="celery", clock=clock) as q:
        yield q


def entries() -> dict[str, object]:
    return {p: make_spec(p, "tasks.tick", 60.0, args=(p,),
                         options={"delayq_misfire": p, "delayq_grace": 10})
            for p in POLICIES}


def installer(queue: DelayedQueue) -> Installer:
    return Installer(queue, BeatStore(queue.db, queue.table), ZoneInfo("UTC"), SETTINGS)


def rows(url: str) -> list[tuple[str, datetime, datetime, bytes]]:
    """(entry, occurrence, scheduledAt, payload) of every row, oldest occurrence first."""
    with psycopg.connect(url) as conn:
        found = conn.execute(
            'SELECT split_part("pKey", \'/\', 1), "scheduledAtInitially", "scheduledAt", '
            '"payload" FROM delayed_queue ORDER BY 2, 1').fetchall()
    return [(e, from_ms(a), from_ms(s), bytes(p)) for e, a, s, p in found]


def due(url: str, policy: str, now: datetime = RESTART) -> list[int]:
    """Minutes after T0 of the entry's rows due at ``now``."""
    return [int((at - T0) / MINUTE) for e, at, s, _ in rows(url) if e == policy and s <= now]


def run_due(url: str, now: datetime) -> None:
    """What a worker that stayed up did: every due row ran (and was acked)."""
    with psycopg.connect(url) as conn:
        conn.execute('DELETE FROM delayed_queue WHERE "scheduledAt" <= %s', (to_ms(now),))


def _restart(url: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    with DelayedQueue(url, kind="celery", clock=lambda: RESTART) as q:
        inst = installer(q)
        specs = entries()
        barrier.wait()
        inst.refresh(specs)  # type: ignore[arg-type]


@pytest.mark.slow
def test_beats_restarted_together_catch_the_gap_up_once_by_policy(
        queue: DelayedQueue, clock: Clock, database_url: str) -> None:
    installer(queue).refresh(entries())  # type: ignore[arg-type]
    assert max(at for _, at, _, _ in rows(database_url)) == T0 + 10 * MINUTE
    clock.now = RESTART
    run_due(database_url, RESTART)  # a worker stayed up: the installed horizon ran
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_restart, args=(database_url, barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert {p: due(database_url, p) for p in POLICIES} == GAP_RUNS
    # The runs are due at the restart, with the new horizon after them; one row per key.
    for policy in POLICIES:
        later = [at for e, at, s, _ in rows(database_url) if e == policy and at > RESTART]
        assert later == [T0 + i * MINUTE for i in range(31, 41)]
    keys = [(e, at) for e, at, _, _ in rows(database_url)]
    assert len(keys) == len(set(keys))
    # Closed: a further refresh, by an old installer or a new one, catches up nothing more.
    run_due(database_url, RESTART)
    installer(queue).refresh(entries())  # type: ignore[arg-type]
    assert all(due(database_url, p) == [] for p in POLICIES)


def test_run_all_catches_up_at_most_the_bound(queue: DelayedQueue, clock: Clock,
                                              database_url: str) -> None:
    every_second = {"fast": make_spec("fast", "tasks.tick", 1.0,
                                      options={"delayq_misfire": "run_all"})}
    installer(queue).refresh(every_second)  # type: ignore[arg-type]
    clock.now = T0 + timedelta(hours=2)
    run_due(database_url, T0 + 11 * MINUTE)
    inst = installer(queue)
    inst.refresh(every_second)  # type: ignore[arg-type]
    [caught] = inst.caught_up.values()
    # The newest thousand, up to where the regular install starts (now + min_lead).
    assert len(caught) == 1000 and caught[-1] == clock.now + SETTINGS.min_lead


def test_a_worker_back_before_any_beat_drops_superseded_occurrences(
        queue: DelayedQueue, clock: Clock, database_url: str) -> None:
    """Everything was down: the worker comes back first and finds the ten stale rows of each
    entry. Under coalesce none runs (newer occurrences passed, uninstalled: the beat's
    catch-up is the one run), under skip none, under run_all all of them."""
    installer(queue).refresh(entries())  # type: ignore[arg-type]
    kept = {p: [] for p in POLICIES}  # type: dict[str, list[int]]
    for entry, at, _, payload in rows(database_url):
        if not drop_misfired(queue, "celery", message.decode(payload), to_ms(RESTART)):
            kept[entry].append(int((at - T0) / MINUTE))
    assert kept == {"coalesce": [], "skip": [], "run_all": list(range(1, 11))}
    # The newest stale coalesce row names its successor, which is what supersedes it.
    newest = max((r for r in rows(database_url) if r[0] == "coalesce"), key=lambda r: r[1])
    header = message.decode(newest[3])["headers"]["delayq_beat"]
    assert header["next_ms"] == to_ms(T0 + 11 * MINUTE)
    # On time (within grace of its occurrence), the same row still runs.
    assert not drop_misfired(queue, "celery", message.decode(newest[3]),
                             to_ms(newest[1]) + 5_000)
