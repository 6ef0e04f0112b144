"""Installer against real PostgreSQL: install, replace, uninstall, rename, misfire, DB entries."""

from __future__ import annotations

import logging
import multiprocessing
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from celery.schedules import crontab

from delayq_beat import BeatStore, Installer, Settings, drop_misfired, make_spec
from delayq_beat.entries import EntrySpec
from delayq_beat.installer import Route, default_route, occurrence_task_id
from delayq_transport import DelayedQueue
from delayq_transport.core.integrations import parse_cron_key
from delayq_transport.core.queue import to_ms
from delayq_transport.formats import celery as message

UTC_ZONE = ZoneInfo("UTC")
T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
SETTINGS = Settings(refresh_interval=timedelta(seconds=60), horizon=timedelta(minutes=10))


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def base(database_url: str, clock: Clock) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind="celery", clock=clock) as q:
        yield q


def installer(queue: DelayedQueue, settings: Settings = SETTINGS) -> Installer:
    return Installer(queue, BeatStore(queue.db, queue.table), UTC_ZONE, settings)


def spec(name: str, sched: object = 60.0, **kw: object):
    return make_spec(name, kw.pop("task", "tasks.tick"), sched, **kw)


def rows(queue: DelayedQueue, kind: str = "celery") -> list[tuple[str, int, bytes, int]]:
    with psycopg.connect(queue.db.url) as conn:
        return conn.execute(
            'SELECT "pKey", "scheduledAt", "payload", "createdAt" FROM delayed_queue '
            'WHERE "pKind" = %s ORDER BY "scheduledAt", "pKey"', (kind,)).fetchall()


def names(queue: DelayedQueue, kind: str = "celery") -> set[str]:
    return {parse_cron_key(k)[0] for k, *_ in rows(queue, kind)}


def test_installs_horizon_as_ready_celery_messages(base: DelayedQueue) -> None:
    entry = spec("every_minute", 60.0, args=(1,), kwargs={"k": "v"},
                 options={"expires": 30, "priority": 0})
    report = installer(base).refresh({"every_minute": entry})
    got = rows(base)
    assert report.installed == {"every_minute": 10} and len(got) == 10  # 10 min horizon
    key, at_ms, payload, _ = got[0]
    prefix, hash_, at = parse_cron_key(key)
    assert (prefix, at, at_ms) == ("every_minute", T0 + timedelta(minutes=1), to_ms(at))
    msg = message.decode(payload)
    h = msg["headers"]
    assert h["task"] == "tasks.tick" and h["id"] == occurrence_task_id(key)
    assert uuid.UUID(h["id"]).version == 5
    assert datetime.fromisoformat(h["expires"]) == at + timedelta(seconds=30)
    assert h["delayq_beat"]["misfire"] == "coalesce" and h["delayq_beat"]["at_ms"] == at_ms
    assert msg["properties"]["delivery_info"]["routing_key"] == "celery"


def test_task_ids_are_deterministic_across_installers(base: DelayedQueue, clock: Clock) -> None:
    entry = {"e": spec("e")}
    installer(base).refresh(entry)
    first = {k: message.decode(p)["headers"]["id"] for k, _, p, _ in rows(base)}
    assert all(first[k] == occurrence_task_id(k) for k in first)
    assert len(set(first.values())) == len(first)


def test_second_refresh_only_adds_new_occurrences(base: DelayedQueue, clock: Clock) -> None:
    inst = installer(base)
    entry = {"e": spec("e", options={"delayq_misfire": "run_all"})}
    inst.refresh(entry)
    assert inst.refresh(entry).installed == {}
    clock.now += timedelta(minutes=3)
    report = inst.refresh(entry)
    assert report.installed == {"e": 3}
    assert len(rows(base)) == 13  # nobody consumed the old ones


def test_a_stalled_refresh_does_not_revive_a_tick_that_ran_meanwhile(
        base: DelayedQueue, clock: Clock) -> None:
    """min_lead holds at the insert, not only when the refresh reads the clock: a restarted
    beat (its first refresh re-offers the whole horizon) reads now = 58.5 s, stalls 3 s while
    a worker runs and acks the tick of 60 s, then inserts: that tick must not come back."""
    entry = {"e": spec("e", options={"delayq_misfire": "run_all"})}
    installer(base).refresh(entry)  # T0: the ticks of 1..10 min
    clock.now = T0 + timedelta(seconds=58.5)
    ran: list[str] = []
    routed: list[str] = []

    def stalling_route(s: EntrySpec) -> Route:
        routed.append(s.name)
        if len(routed) == 1:  # the configuration's shape, before the heartbeat reads the clock
            return default_route(s)
        clock.now = T0 + timedelta(seconds=61.5)  # the stall: the tick of 60 s is due ...
        env = base.try_poll()
        assert env is not None
        base.ack(env)  # ... and a worker ran it
        ran.append(env.key)
        return default_route(s)

    restarted = Installer(base, BeatStore(base.db, base.table), UTC_ZONE, SETTINGS,
                          route=stalling_route)
    report = restarted.refresh(entry)
    assert [parse_cron_key(k)[2] for k in ran] == [T0 + timedelta(minutes=1)]
    assert report.installed == {}, "a tick that already ran was installed again"
    assert [parse_cron_key(k)[2] for k, *_ in rows(base)] == [
        T0 + timedelta(minutes=m) for m in range(2, 11)]


def test_priority_and_queue_choose_the_kind(base: DelayedQueue) -> None:
    installer(base).refresh({"p": spec("p", options={"queue": "reports", "priority": 7})})
    assert names(base, message.kind_for("reports", 7)) == {"p"}
    assert rows(base) == []


def test_config_change_replaces_future_occurrences_and_logs(
    base: DelayedQueue, caplog: pytest.LogCaptureFixture
) -> None:
    inst = installer(base)
    inst.refresh({"e": spec("e", args=(1,))})
    old = {parse_cron_key(k)[1] for k, *_ in rows(base)}
    with caplog.at_level(logging.WARNING, logger="delayq_transport.scheduling"):
        report = inst.refresh({"e": spec("e", args=(2,))})
    new = {parse_cron_key(k)[1] for k, *_ in rows(base)}
    assert report.replaced == ["e"] and len(old) == len(new) == 1 and old != new
    assert len(rows(base)) == 10
    assert any("config hash changed" in r.getMessage() for r in caplog.records)


def test_removal_is_detected_across_restarts(base: DelayedQueue) -> None:
    first = installer(base)
    first.refresh({"keep": spec("keep"), "drop": spec("drop")})
    first.retire()  # the process stops
    report = installer(base).refresh({"keep": spec("keep")})  # a new process
    assert report.uninstalled == {"drop": 10}
    assert names(base) == {"keep"}
    assert [i.name for i in BeatStore(base.db).installed()] == ["keep"]


def test_rename_uninstalls_old_and_installs_new(base: DelayedQueue) -> None:
    inst = installer(base)
    inst.refresh({"old_name": spec("old_name")})
    report = inst.refresh({"new_name": spec("new_name")})
    assert report.uninstalled == {"old_name": 10} and report.installed == {"new_name": 10}
    assert names(base) == {"new_name"}


def test_queue_change_moves_rows_between_kinds(base: DelayedQueue) -> None:
    inst = installer(base)
    inst.refresh({"e": spec("e")})
    inst.refresh({"e": spec("e", options={"queue": "other"})})
    assert rows(base) == [] and names(base, "other") == {"e"}


def test_like_metacharacters_and_slashes_in_names(base: DelayedQueue) -> None:
    entries = {n: spec(n) for n in ("a_b", "axb", "a%b", "a/b", "a")}
    inst = installer(base)
    inst.refresh(entries)
    assert names(base) == {"a_b", "axb", "a%25b", "a%2Fb", "a"}
    del entries["a_b"], entries["a"]
    report = inst.refresh(entries)
    assert set(report.uninstalled) == {"a_b", "a"}
    assert names(base) == {"axb", "a%25b", "a%2Fb"}
    assert len(rows(base)) == 30


def test_bad_entry_is_reported_and_others_still_install(base: DelayedQueue) -> None:
    inst = installer(base)
    naive = spec("naive", options={"expires": datetime(2030, 1, 1)})
    entries = {"good": spec("good"), "naive": naive, "broken": ValueError("Invalid crontab")}
    report = inst.refresh(entries)
    assert set(report.errors) == {"naive", "broken"}
    assert "timezone-aware" in report.errors["naive"]
    assert names(base) == {"good"}


def test_broken_entry_keeps_its_installed_rows(base: DelayedQueue) -> None:
    inst = installer(base)
    inst.refresh({"e": spec("e")})
    report = inst.refresh({"e": ValueError("now broken")})
    assert report.uninstalled == {} and len(rows(base)) == 10


# -- misfire -----------------------------------------------------------------------------


def outage(base: DelayedQueue, clock: Clock, policy: str, grace: float = 60) -> list[datetime]:
    entry = {"m": spec("m", options={"delayq_misfire": policy, "delayq_grace": grace})}
    inst = installer(base)
    inst.refresh(entry)
    clock.now += timedelta(minutes=5, seconds=30)  # no worker ran: 5 occurrences due
    inst.refresh(entry)
    due = [parse_cron_key(k)[2] for k, at, *_ in rows(base) if at <= to_ms(clock.now)]
    return due


def test_misfire_coalesce_keeps_only_newest_due(base: DelayedQueue, clock: Clock) -> None:
    assert outage(base, clock, "coalesce") == [T0 + timedelta(minutes=5)]


def test_misfire_run_all_keeps_every_occurrence(base: DelayedQueue, clock: Clock) -> None:
    assert len(outage(base, clock, "run_all")) == 5


def test_misfire_skip_drops_those_older_than_grace(base: DelayedQueue, clock: Clock) -> None:
    # 90 s grace: the occurrences at +4 and +5 min (90 and 30 s late) are not misfired yet
    assert outage(base, clock, "skip", grace=120) == [T0 + timedelta(minutes=4),
                                                      T0 + timedelta(minutes=5)]


@pytest.mark.parametrize("policy,expected_run", [("coalesce", [5]), ("skip", []),
                                                  ("run_all", [1, 2, 3, 4, 5])])
def test_worker_side_helper_applies_policy_before_beat_refreshes(
    base: DelayedQueue, clock: Clock, policy: str, expected_run: list[int]
) -> None:
    installer(base).refresh({"m": spec("m", options={"delayq_misfire": policy,
                                                     "delayq_grace": 10})})
    clock.now += timedelta(minutes=5, seconds=30)
    ran = []
    for env in base.try_poll_many(100):
        if not drop_misfired(base, env.kind, message.decode(env.payload), to_ms(clock.now)):
            ran.append(int((env.scheduled_at - T0).total_seconds() // 60))
    assert ran == expected_run


def test_helper_ignores_ordinary_and_on_time_messages(base: DelayedQueue) -> None:
    plain = message.task_message("tasks.x")
    assert drop_misfired(base, "celery", plain) is False
    installer(base).refresh({"m": spec("m", options={"delayq_misfire": "skip"})})
    _, _, payload, _ = rows(base)[0]
    assert drop_misfired(base, "celery", message.decode(payload), to_ms(T0)) is False


# -- DB-backed entries -------------------------------------------------------------------


def test_db_entries_add_disable_enable_remove(base: DelayedQueue) -> None:
    store = BeatStore(base.db)
    inst = installer(base)
    store.add("db_e", "tasks.tick", crontab(minute="*/2"), args=[1])
    assert inst.refresh({}).installed == {"db_e": 5}
    assert store.disable("db_e") is True
    assert inst.refresh({}).uninstalled == {"db_e": 5}
    store.enable("db_e")
    assert inst.refresh({}).installed == {"db_e": 5}
    store.add("db_e", "tasks.tick", crontab(minute="*/5"), args=[1])
    # */5 over a 10 min horizon is 2 occurrences, extended to the minimum of 3
    assert inst.refresh({}).replaced == ["db_e"] and len(rows(base)) == 3
    assert store.remove("db_e") is True
    assert inst.refresh({}).uninstalled == {"db_e": 3} and rows(base) == []


def test_db_override_disables_a_beat_schedule_entry(base: DelayedQueue) -> None:
    store = BeatStore(base.db)
    inst = installer(base)
    inst.refresh({"cfg": spec("cfg")})
    assert store.disable("cfg") is False  # an override, not a DB-backed entry
    assert inst.refresh({"cfg": spec("cfg")}).uninstalled == {"cfg": 10}
    store.remove("cfg")
    assert inst.refresh({"cfg": spec("cfg")}).installed == {"cfg": 10}


def test_invalid_stored_entry_is_reported_others_run(base: DelayedQueue) -> None:
    store = BeatStore(base.db)
    store.add("fine", "tasks.tick", 60.0)
    with psycopg.connect(base.db.url, autocommit=True) as conn:
        conn.execute(
            'INSERT INTO delayq_schedule_entries ("tableName", name, definition, enabled, '
            '"updatedAt") VALUES (%s, %s, %s::jsonb, true, 0)',
            ("delayed_queue", "bad_cron",
             '{"task": "t", "schedule": {"type": "crontab", "minute": "77"}}'))
    report = installer(base).refresh({})
    assert "bad_cron" in report.errors and "Invalid" in report.errors["bad_cron"]
    assert names(base) == {"fine"}


def test_store_refuses_bad_entries_and_stores_nothing(base: DelayedQueue) -> None:
    store = BeatStore(base.db)
    for bad in [dict(task=""), dict(schedule="soon"), dict(args=[object()])]:
        kwargs = dict(name="x", task="t", schedule=60.0) | bad
        with pytest.raises(ValueError):
            store.add(**kwargs)
    assert store.entries() == []


# -- several installers at once ---------------------------------------------------------


def _refresh_many(url: str, times: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    with DelayedQueue(url, kind="celery") as q:
        inst = Installer(q, BeatStore(q.db), UTC_ZONE,
                         Settings(timedelta(seconds=1), timedelta(seconds=30)))
        entries = {f"e{i}": spec(f"e{i}", 1.0) for i in range(5)}
        barrier.wait()
        for _ in range(times):
            inst.refresh(entries)


@pytest.mark.slow
def test_concurrent_installers_create_one_row_per_occurrence(database_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_refresh_many, args=(database_url, 5, barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with psycopg.connect(database_url) as conn:
        per_key = conn.execute('SELECT "pKey", count(*) FROM delayed_queue GROUP BY 1').fetchall()
        times = conn.execute(
            """SELECT split_part("pKey", '/', 1), count(DISTINCT "scheduledAt"), count(*)
               FROM delayed_queue GROUP BY 1""").fetchall()
    assert per_key and all(n == 1 for _, n in per_key)
    assert len(times) == 5 and all(distinct == total >= 28 for _, distinct, total in times)
