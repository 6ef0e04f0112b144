"""One-off entries, intervals anchored at their first install, an entry's own zone, start and end,
against real PostgreSQL with several installer processes at once (injected clock): exactly once
whoever installs, never again once run."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from test_beat_catchup import rows
from test_beat_installer import T0, Clock  # beat's tests' injected clock

from delayq_beat import BeatStore, Installer, Settings, make_spec
from delayq_transport import DelayedQueue
from delayq_transport.core.queue import from_ms, to_ms
from delayq_transport.formats import celery as message
from delayq_transport.scheduling.schedules import Clocked

UTC = ZoneInfo("UTC")
NY = ZoneInfo("America/New_York")
MINUTE = timedelta(minutes=1)
SETTINGS = Settings(refresh_interval=MINUTE, horizon=10 * MINUTE)


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def queue(database_url: str, clock: Clock) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind="celery", clock=clock) as q:
        yield q


def entry(name: str, sched: object, **options: object) -> object:
    return make_spec(name, "tasks.tick", sched, options=options)


def refresh(queue: DelayedQueue, *specs: object) -> object:
    """A scheduler's single pass: it refreshes once and stops (retires)."""
    inst = Installer(queue, BeatStore(queue.db, queue.table), UTC, SETTINGS)
    try:
        return inst.refresh({s.name: s for s in specs})  # type: ignore[attr-defined]
    finally:
        inst.retire()


def run_all(url: str) -> None:
    """A worker ran everything there was."""
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM delayed_queue")


def _specs() -> list[object]:
    return [entry("once", Clocked(to_ms(T0 + 5 * MINUTE))),
            entry("late-once", Clocked(to_ms(T0 - 3 * MINUTE))),
            entry("late-skip", Clocked(to_ms(T0 - 3 * MINUTE)), delayq_misfire="skip"),
            entry("anchored", 240.0, delayq_anchor="first_install"),
            entry("first-only", 240.0, delayq_one_off=True)]


def _install(url: str, now_ms: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    with DelayedQueue(url, kind="celery", clock=lambda: from_ms(now_ms)) as q:
        specs = _specs()
        barrier.wait()
        refresh(q, *specs)


def _together(url: str, now: datetime, n: int = 4) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_install, args=(url, to_ms(now), barrier)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n


@pytest.mark.slow
def test_one_offs_and_first_install_anchors_with_several_installers(database_url: str) -> None:
    _together(database_url, T0)
    got = rows(database_url)
    by = {name: [(at, due) for e, at, due, _ in got if e == name] for name in
          ("once", "late-once", "late-skip", "anchored", "first-only")}
    assert by["once"] == [(T0 + 5 * MINUTE, T0 + 5 * MINUTE)]
    # First seen past its time: run once, at once (coalesce), or not (skip, more than grace).
    assert by["late-once"] == [(T0 - 3 * MINUTE, T0)] and by["late-skip"] == []
    # One anchor for everyone: the first install (T0 here), first run one period later.
    assert [at for at, _ in by["anchored"]] == [T0 + i * 4 * MINUTE for i in (1, 2, 3)]
    assert by["first-only"] == [(T0 + 4 * MINUTE, T0 + 4 * MINUTE)]
    keys = [(e, at) for e, at, _, _ in got]
    assert len(keys) == len(set(keys))

    # They ran; later refreshes by new installers (the anchor is read back, not re-made)
    # install no one-off again, and the anchored interval keeps its phase.
    run_all(database_url)
    later = T0 + 13 * MINUTE
    _together(database_url, later)
    got = rows(database_url)
    assert {e for e, *_ in got} == {"anchored"}
    assert [at for _, at, _, _ in got] == [T0 + i * 4 * MINUTE for i in (4, 5, 6)]


def test_a_changed_anchored_entry_is_anchored_again(queue: DelayedQueue, clock: Clock,
                                                    database_url: str) -> None:
    refresh(queue, entry("a", 240.0, delayq_anchor="first_install"))
    clock.now = T0 + timedelta(minutes=1, seconds=30)
    run_all(database_url)
    refresh(queue, entry("a", 240.0, delayq_anchor="first_install", queue="other"))
    assert [at for _, at, _, _ in rows_of(database_url, "other")][:2] == [
        clock.now + 4 * MINUTE, clock.now + 8 * MINUTE]


def rows_of(url: str, kind: str) -> list[tuple[str, datetime, datetime, bytes]]:
    with psycopg.connect(url) as conn:
        found = conn.execute('SELECT split_part("pKey", \'/\', 1), "scheduledAtInitially", '
                             '"scheduledAt", "payload" FROM delayed_queue WHERE "pKind" = %s '
                             "ORDER BY 2", (kind,)).fetchall()
    return [(e, from_ms(a), from_ms(s), bytes(p)) for e, a, s, p in found]


def test_start_end_and_the_entrys_zone_shape_what_is_installed(queue: DelayedQueue,
                                                               database_url: str) -> None:
    ny_nine = make_spec("ny", "tasks.report", _ZonedCrontab(NY, minute=0, hour=9),
                        options={"delayq_expires": T0 + timedelta(days=2)})
    bounded = entry("bounded", 60.0, delayq_start_time=T0 + 3 * MINUTE,
                    delayq_expires=T0 + 6 * MINUTE)
    refresh(queue, ny_nine, bounded)
    got = rows(database_url)
    assert [at.astimezone(NY).strftime("%d %H:%M") for e, at, *_ in got if e == "ny"] == \
        ["01 09:00", "02 09:00"]  # Jan 1 and 2 09:00 New York; the 3rd is after the end
    assert [at for e, at, *_ in got if e == "bounded"] == [T0 + i * MINUTE for i in (3, 4, 5)]


def test_messages_carry_the_entry_name_as_django_celery_results_shows_it(
        queue: DelayedQueue, database_url: str) -> None:
    refresh(queue, entry("nightly report", 60.0))
    headers = message.decode(rows(database_url)[0][3])["headers"]
    assert headers["periodic_task_name"] == "nightly report"
    assert headers["delayq_beat"]["next_ms"] == to_ms(T0 + 2 * MINUTE)


def test_a_zoned_crontab_stored_in_the_database_keeps_its_zone(queue: DelayedQueue,
                                                               database_url: str) -> None:
    BeatStore(queue.db, queue.table).add("db-ny", "tasks.report",
                                         _ZonedCrontab(NY, minute=30, hour=7))
    refresh(queue)
    assert {at.astimezone(NY).strftime("%H:%M") for e, at, *_ in rows(database_url)} == {"07:30"}


class _ZonedCrontab:
    """A crontab with its own zone, as django-celery-beat's TzAwareCrontab sets it."""

    def __new__(cls, tz: ZoneInfo, **fields: object) -> object:
        from celery.schedules import crontab

        made = crontab(**fields)
        made.tz = tz  # type: ignore[misc]
        return made


def test_cli_adds_one_offs_zones_anchors_and_bounds(queue: DelayedQueue,
                                                    database_url: str) -> None:
    from click.testing import CliRunner

    from delayq_transport.cli import main

    env = {"DELAYQ_DATABASE_URL": database_url, "COLUMNS": "200"}
    run = CliRunner().invoke
    added = [run(main, ["beat", "add", *args], env=env) for args in (
        ["once", "t.once", "--at", "2030-01-01T12:05:00+00:00"],
        ["ny", "t.ny", "--crontab", "30 7 * * *", "--tz", "America/New_York",
         "--end", "2030-01-03T00:00:00+00:00"],
        ["anchored", "t.a", "--every", "240", "--anchor", "first_install", "--one-off"])]
    assert [r.exit_code for r in added] == [0, 0, 0], [r.output for r in added]
    bad = run(main, ["beat", "add", "x", "t.x", "--every", "60", "--tz", "Mars/Olympus"],
              env=env)
    assert bad.exit_code == 1 and "unknown time zone" in bad.output
    listed = run(main, ["beat", "list"], env=env).output
    assert "once at 2030-01-01 12:05:00 UTC" in listed and "every 240.0s first_install" in listed
    refresh(queue)
    got = {e: [at for name, at, *_ in rows(database_url) if name == e]
           for e in ("once", "ny", "anchored")}
    assert got == {"once": [T0 + 5 * MINUTE],  # 07:30 New York is 12:30 UTC in January
                   "ny": [T0 + 30 * MINUTE, T0 + timedelta(days=1, minutes=30)],
                   "anchored": [T0 + 4 * MINUTE]}
