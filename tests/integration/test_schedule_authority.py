"""Schedulers of two configurations at once (a rolling deploy), against real PostgreSQL: the rule
of delayq_transport/scheduling/authority.py decides which one is in force, whoever refreshed
last. The newest configuration's schedulers act once every scheduler alive has seen it; the
old one's install and uninstall nothing; an entry in both keeps every occurrence (a changed one
switches from one instant on, nothing lost or doubled); an entry that became invalid keeps its
rows; a rollback (the new schedulers gone) hands authority back. Injected clock, except for the
processes of the last test (the database's)."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta

import psycopg
import pytest
from test_beat_installer import T0, UTC_ZONE, Clock, installer, spec

from delayq_beat import BeatStore, Installer, Settings
from delayq_beat.entries import EntrySpec
from delayq_beat.installer import Route, default_route
from delayq_transport import DelayedQueue
from delayq_transport.core.integrations import parse_cron_key
from delayq_transport.core.queue import to_ms

Config = Mapping[str, EntrySpec | Exception]
#: The old release: "removed" is gone from the new one, "changed" has new args, "broken" became
#: invalid; "added" is new.
OLD: Config = {"keep": spec("keep"), "changed": spec("changed", args=(1,)),
               "removed": spec("removed"), "broken": spec("broken")}
NEW: Config = {"keep": spec("keep"), "changed": spec("changed", args=(2,)),
               "added": spec("added"), "broken": ValueError("Invalid crontab")}
SECOND = timedelta(seconds=1)


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def base(database_url: str, clock: Clock) -> Iterator[DelayedQueue]:
    """The queue on the injected clock, as test_beat_installer's."""
    with DelayedQueue(database_url, kind="celery", clock=clock) as q:
        yield q


def keys(queue: DelayedQueue) -> set[tuple[str, str, datetime]]:
    """(entry, hash, occurrence) of every row."""
    with psycopg.connect(queue.db.url) as conn:
        found = conn.execute('SELECT "pKey" FROM delayed_queue').fetchall()
    return {parse_cron_key(k) for (k,) in found}


def entries(queue: DelayedQueue, after: datetime | None = None) -> dict[str, set[str]]:
    """entry -> the config hashes its rows (due after ``after``) carry."""
    out: dict[str, set[str]] = {}
    for name, hash_, at in keys(queue):
        if after is None or at > after:
            out.setdefault(name, set()).add(hash_)
    return out


def deployed(queue: DelayedQueue, clock: Clock) -> tuple[Installer, Installer]:
    """The old release in force, then the new one's first scheduler ten seconds later."""
    old, new = installer(queue), installer(queue)
    old.refresh(OLD)
    clock.now += 10 * SECOND
    new.refresh(NEW)
    return old, new


def test_whoever_refreshes_last_the_newest_configuration_holds(
        base: DelayedQueue, clock: Clock) -> None:
    """What failed before the rule: the old release's beat, refreshing last, put back what the
    new one removed and uninstalled what it added ("last writer wins")."""
    old, new = deployed(base, clock)
    for _ in range(3):
        old.refresh(OLD)
        new.refresh(NEW)
        clock.now += SECOND
        old.refresh(OLD)  # the old release refreshes last
        found = entries(base)
        assert set(found) == {"keep", "changed", "broken", "added"}
        assert len(found["changed"]) == 1 and found["changed"] != entries_of(OLD, "changed")


def entries_of(config: Config, name: str) -> set[str]:
    """The config hash an installer computes for one entry of a configuration."""
    from delayq_transport.scheduling.entries import entry_hash

    entry = config[name]
    assert isinstance(entry, EntrySpec)
    return {entry_hash(entry, UTC_ZONE)}


def test_the_new_configuration_acts_once_the_old_schedulers_have_seen_it(
        base: DelayedQueue, clock: Clock) -> None:
    old, new = installer(base), installer(base)
    assert old.refresh(OLD).in_force
    before = keys(base)
    clock.now += 10 * SECOND
    first = new.refresh(NEW)  # the old one may be in the middle of a refresh: wait for it
    assert not first.in_force and keys(base) == before
    assert not old.refresh(OLD).in_force and keys(base) == before  # it sees the new one
    report = new.refresh(NEW)
    assert report.in_force and report.replaced == ["changed"]
    assert report.uninstalled == {"removed": 10} and report.installed["added"] == 10
    assert "broken" in report.errors
    rows = keys(base)
    assert {k for k in rows if k[0] == "broken"} == {k for k in before if k[0] == "broken"}
    assert entries(base)["changed"] == entries_of(NEW, "changed")
    for _ in range(3):  # and it stays so, in whatever order they refresh
        assert not old.refresh(OLD).in_force
        assert new.refresh(NEW).in_force
        assert keys(base) == rows


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_rollback_hands_authority_back(base: DelayedQueue, clock: Clock, how: str) -> None:
    old, new = deployed(base, clock)
    old.refresh(OLD)
    new.refresh(NEW)
    assert set(entries(base)) == {"keep", "changed", "broken", "added"}
    if how == "stopped":
        new.retire()  # a stop retires its heartbeat at once
    else:  # a kill: its heartbeat lapses after three refresh intervals
        clock.now += new.settings.alive_for - SECOND
        assert not old.refresh(OLD).in_force
        clock.now += SECOND
    report = old.refresh(OLD)
    assert report.in_force and report.replaced == ["changed"]
    assert report.uninstalled == {"added": 10} and report.installed["removed"] == 10
    # (the new configuration's rows that fell due meanwhile stay: nobody ran them yet)
    coming = entries(base, after=clock.now + old.settings.min_lead)
    assert set(coming) == {"keep", "changed", "broken", "removed"}
    assert coming["changed"] == entries_of(OLD, "changed")


def test_an_old_release_restarted_during_the_deploy_does_not_take_over(
        base: DelayedQueue, clock: Clock) -> None:
    """Its configuration was first seen before the new one, whichever process runs it."""
    old, new = deployed(base, clock)
    old.refresh(OLD)
    new.refresh(NEW)
    old.retire()
    rows = keys(base)
    clock.now += 5 * SECOND
    restarted = installer(base)
    assert not restarted.refresh(OLD).in_force
    assert new.refresh(NEW).in_force
    assert not restarted.refresh(OLD).in_force and keys(base) == rows


@pytest.mark.parametrize("idle_config", [{}, {"typo": ValueError("Invalid crontab")}],
                         ids=["empty", "only-invalid"])
def test_a_configuration_without_a_valid_entry_yields_to_any_other_and_acts_alone(
        base: DelayedQueue, clock: Clock, idle_config: Config) -> None:
    """A scheduler with no valid entry of its own (a Dramatiq worker that imports no periodic
    actor; the trial of issue 50: a worker whose PERIODIC held one broken entry) uninstalls
    nothing while one with valid entries is alive; alone, it is in force."""
    old = installer(base)
    old.refresh(OLD)
    rows = keys(base)
    clock.now += SECOND
    idle = installer(base)
    assert not idle.refresh(idle_config).in_force and keys(base) == rows
    assert old.refresh(OLD).in_force
    old.retire()
    report = idle.refresh(idle_config)
    assert report.in_force and set(report.uninstalled) == set(OLD) and keys(base) == set()


def test_a_changed_entry_switches_from_one_instant_on(base: DelayedQueue, clock: Clock) -> None:
    """Rows due before now + min_lead stay and run as installed, the new configuration's start
    after it: one row for every second, none lost and none doubled (install_tick deleted them
    all and started the new ones after min_lead: the seconds in between never ran)."""
    inst = installer(base, Settings(timedelta(seconds=5), timedelta(seconds=30)))
    inst.refresh({"s": spec("s", 1.0, options={"delayq_misfire": "run_all"})})
    clock.now = T0 + timedelta(seconds=5, milliseconds=500)  # 2..5 due, nobody took them
    report = inst.refresh({"s": spec("s", 1.0, args=(2,),
                                     options={"delayq_misfire": "run_all", "queue": "other"})})
    assert report.replaced == ["s"]
    rows = sorted((at, name_hash, kind) for name_hash, at, kind in _with_kinds(base))
    seconds = [to_ms(at) // 1000 - to_ms(T0) // 1000 for at, _, _ in rows]
    assert seconds == list(range(2, seconds[-1] + 1)) and seconds[-1] >= 30
    boundary = clock.now + inst.settings.min_lead
    old_hash = {h for at, h, _ in rows if at <= boundary}
    assert len(old_hash) == 1 and not old_hash & {h for at, h, _ in rows if at > boundary}
    assert {k for at, _, k in rows if at <= boundary} == {"celery"}  # where they were
    assert {k for at, _, k in rows if at > boundary} == {"other"}  # where they go now


def _with_kinds(queue: DelayedQueue) -> list[tuple[str, datetime, str]]:
    with psycopg.connect(queue.db.url) as conn:
        found = conn.execute('SELECT "pKey", "pKind" FROM delayed_queue').fetchall()
    return [(parse_cron_key(k)[1], parse_cron_key(k)[2], kind) for k, kind in found]


@pytest.mark.parametrize(("stall_s", "writes"), [(1.3, True), (2.3, False)])
def test_a_long_refresh_renews_its_heartbeat_or_stops_writing(
        base: DelayedQueue, stall_s: float, writes: bool) -> None:
    """Refreshing every second, a heartbeat lives 3 s: a refresh stalled 1.3 s renews it
    before writing; one stalled 2.3 s (its heartbeat may lapse before the write lands, and
    another configuration take over) writes nothing."""
    routed: list[str] = []

    def stalling(s: EntrySpec) -> Route:
        routed.append(s.name)
        if len(routed) == 2:  # the refresh's own routing, after its heartbeat
            time.sleep(stall_s)  # the stall itself, not a wait for an event
        return default_route(s)

    settings = Settings(timedelta(seconds=1), timedelta(minutes=10))
    inst = Installer(base, BeatStore(base.db, base.table), UTC_ZONE, settings, route=stalling)
    report = inst.refresh({"keep": spec("keep")})
    assert report.in_force is writes and bool(keys(base)) is writes
    assert inst.refresh({"keep": spec("keep")}).in_force  # beats again, and writes
    assert {k[0] for k in keys(base)} == {"keep"}


def test_a_lapsed_schedulers_row_is_kept_a_week_then_pruned(
        base: DelayedQueue, clock: Clock) -> None:
    """Kept, it remembers when its configuration was first seen; then the table stays small."""
    from delayq_transport.scheduling.authority import KEEP, configuration_hash

    gone, live = installer(base), installer(base)
    gone.refresh(OLD)
    gone.retire()
    live.refresh(OLD)
    assert len(_schedulers(base)) == 2
    clock.now += KEEP + SECOND
    live.refresh(OLD)
    assert [r[1] for r in _schedulers(base)] == [configuration_hash(live.shapes(OLD))]


def _schedulers(queue: DelayedQueue) -> list[tuple[str, str, int]]:
    with psycopg.connect(queue.db.url) as conn:
        return conn.execute('SELECT "schedulerId", "configHash", "configSince" '
                            'FROM delayq_schedule_schedulers ORDER BY 1').fetchall()


# -- several processes, the database's clock ----------------------------------------------

RELEASES: dict[str, Config] = {
    "old": {"tick": spec("tick", 1.0), "changed": spec("changed", 1.0, args=(1,)),
            "removed": spec("removed", 1.0)},
    "new": {"tick": spec("tick", 1.0), "changed": spec("changed", 1.0, args=(2,)),
            "added": spec("added", 1.0)},
}
PROCESS_SETTINGS = Settings(timedelta(seconds=0.5), timedelta(seconds=5))


def _refresh_for(url: str, release: str, seconds: float, seed: int,
                 barrier: multiprocessing.synchronize.Barrier) -> None:
    rng = random.Random(seed)
    with DelayedQueue(url, kind="celery") as q:
        inst = Installer(q, BeatStore(q.db), UTC_ZONE, PROCESS_SETTINGS)
        barrier.wait()
        if release == "new":
            time.sleep(1.0)  # the deploy starts while the old release runs
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            inst.refresh(RELEASES[release])
            time.sleep(rng.uniform(0, 0.3))


def _doubled(url: str) -> list[tuple[str, str, int]]:
    """Instants holding two rows of one entry (two hashes at once)."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            """SELECT split_part("pKey", '/', 1), split_part("pKey", '/', 3), count(*)
               FROM delayed_queue GROUP BY 1, 2 HAVING count(*) > 1""").fetchall()


@pytest.mark.slow
def test_two_releases_in_four_processes_agree_and_never_double_an_instant(
        database_url: str) -> None:
    """Two processes of each release refresh at random moments for a few seconds: no instant
    ever holds two rows of an entry, and the new release's configuration is what stays."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_refresh_for, args=(database_url, release, 6.0, i, barrier))
             for i, release in enumerate(["old", "old", "new", "new"])]
    for p in procs:
        p.start()
    samples = 0
    try:
        while any(p.is_alive() for p in procs):
            assert _doubled(database_url) == []
            samples += 1
            time.sleep(0.05)
    finally:
        for p in procs:
            p.join(30)
    assert [p.exitcode for p in procs] == [0] * 4
    assert samples > 20 and _doubled(database_url) == []
    with psycopg.connect(database_url) as conn:  # the end of the horizon: the last refreshes'
        tail = conn.execute(
            """SELECT split_part("pKey", '/', 1), split_part("pKey", '/', 2) FROM delayed_queue
               WHERE "scheduledAt" > (SELECT max("scheduledAt") - 2000 FROM delayed_queue)
            """).fetchall()
    assert {n for n, _ in tail} == {"tick", "changed", "added"}
    assert len({h for n, h in tail if n == "changed"}) == 1
    assert {h for n, h in tail if n == "changed"} == entries_of(RELEASES["new"], "changed")
