"""CronService against a real PostgreSQL: config switches, exact uninstalls, LIKE-safe
prefixes, min_lead, background installers (alone and racing), and DST-aware daily schedules."""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from _workers import WAIT_S, FakeClock, wait_until
from conftest import create_database, drop_database

from delayq_transport import CronMessage, CronService, DailySchedule, DelayedQueue, OfferOutcome
from delayq_transport.core.integrations import cron_key, parse_cron_key
from delayq_transport.core.queue import to_ms

CREATED, UPDATED, IGNORED = OfferOutcome.CREATED, OfferOutcome.UPDATED, OfferOutcome.IGNORED
NY = ZoneInfo("America/New_York")
S = timedelta(seconds=1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cq(database_url: str, clock: FakeClock) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind="cron", clock=clock) as q:
        yield q


@pytest.fixture
def cron(cq: DelayedQueue) -> CronService:
    return CronService(cq)


def ticks(clock: FakeClock, *seconds: float, payload: bytes = b"tick") -> list[CronMessage]:
    return [CronMessage(clock() + timedelta(seconds=s), payload) for s in seconds]


def hashes(cron: CronService, prefix: str) -> Counter[str]:
    return Counter(parse_cron_key(m.key)[1] for m in cron.installed(prefix))


def plant(q: DelayedQueue, prefix: str, hash_: str, clock: FakeClock, n: int = 2) -> None:
    """Rows of a config written directly, so several configs of one prefix can coexist."""
    for i in range(n):
        at = clock() + timedelta(minutes=i + 1)
        q.offer(cron_key(prefix, hash_, at), b"planted", at)


# -- install_tick / uninstall_tick -----------------------------------------------------------


def test_install_tick_replaces_other_configs(
    cron: CronService, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    assert cron.install_tick("h1", "job", ticks(clock, 60, 120, 180)) == [CREATED] * 3
    with caplog.at_level(logging.INFO, logger="delayq_transport.core.integrations.cron"):
        assert cron.install_tick("h2", "job", ticks(clock, 90, 150)) == [CREATED] * 2
    assert hashes(cron, "job") == {"h2": 2}
    assert "switched to config h2 (3 old rows removed)" in caplog.text
    ids = [m.id for m in cron.installed("job")]
    assert cron.install_tick("h2", "job", ticks(clock, 90, 150)) == [IGNORED] * 2
    assert [m.id for m in cron.installed("job")] == ids, "the current config's rows are kept"


def test_install_tick_update_policy(cron: CronService, clock: FakeClock) -> None:
    cron.install_tick("h", "job", ticks(clock, 60, payload=b"v1"))
    assert cron.install_tick("h", "job", ticks(clock, 60, payload=b"v2"), can_update=False) == [
        IGNORED
    ]
    assert cron.installed("job")[0].payload == b"v1"
    assert cron.install_tick("h", "job", ticks(clock, 60, payload=b"v2")) == [UPDATED]
    assert cron.installed("job")[0].payload == b"v2"


@pytest.mark.parametrize("target, survivor", [("h1", "h2"), ("h2", "h1")])
def test_uninstall_tick_deletes_exactly_that_config(
    cq: DelayedQueue, cron: CronService, clock: FakeClock, target: str, survivor: str
) -> None:
    plant(cq, "job", "h1", clock, n=3)
    plant(cq, "job", "h2", clock, n=2)
    expected = {"h1": 3, "h2": 2}
    assert cron.uninstall_tick(target, "job") == expected[target]
    assert hashes(cron, "job") == {survivor: expected[survivor]}
    assert cron.uninstall_tick(target, "job") == 0


def test_a_hash_that_prefixes_another_is_distinct(
    cq: DelayedQueue, cron: CronService, clock: FakeClock
) -> None:
    plant(cq, "job", "h", clock)
    plant(cq, "job", "h2", clock)
    assert cron.uninstall_tick("h", "job") == 2 and hashes(cron, "job") == {"h2": 2}
    cron.install_tick("h", "job", ticks(clock, 30))
    assert hashes(cron, "job") == {"h": 1}


def test_uninstall_removes_every_config_of_the_prefix(
    cq: DelayedQueue, cron: CronService, clock: FakeClock
) -> None:
    plant(cq, "job", "h1", clock)
    plant(cq, "job", "h2", clock)
    plant(cq, "jobs", "h1", clock)
    cq.with_kind("elsewhere").offer(cron_key("job", "h1", clock()), b"", clock())
    assert cron.uninstall("job") == 4
    assert cron.installed("job") == [] and hashes(cron, "jobs") == {"h1": 2}
    assert cq.with_kind("elsewhere").count_waiting() == 1, "other kinds are not touched"


PREFIX_PAIRS = [("a", "ab"), ("a_b", "axb"), ("50%", "50x"), ("a", "a_"), ("%", "x"),
                ("a\\b", "a\\\\b"), ("_", "a")]


@pytest.fixture(scope="module")
def shared_url(template_db: str) -> Iterator[str]:
    """One database for the many prefix cases; each case works in a kind of its own."""
    name = f"delayq_cron_{uuid.uuid4().hex[:12]}"
    yield create_database(name, template=template_db)
    drop_database(name)


@pytest.mark.parametrize("mine, theirs", PREFIX_PAIRS + [(t, m) for m, t in PREFIX_PAIRS])
def test_prefixes_never_touch_each_other(shared_url: str, mine: str, theirs: str) -> None:
    """``_`` and ``%`` are literal and ``a`` is not a prefix of ``ab/...``."""
    clock = FakeClock()
    with DelayedQueue(shared_url, kind=uuid.uuid4().hex, clock=clock) as cq:
        check_prefix_isolation(CronService(cq), clock, mine, theirs)


def check_prefix_isolation(cron: CronService, clock: FakeClock, mine: str, theirs: str) -> None:
    """Install, uninstall_tick and uninstall on ``mine``; ``theirs`` keeps every row."""
    cq = cron.queue
    plant(cq, theirs, "old", clock)
    plant(cq, theirs, "new", clock)
    untouched = sorted((m.key, m.payload) for m in cron.installed(theirs))
    plant(cq, mine, "old", clock)

    cron.install_tick("new", mine, ticks(clock, 30))
    assert hashes(cron, mine) == {"new": 1}
    assert cron.uninstall_tick("new", mine) == 1
    plant(cq, mine, "old", clock)
    assert cron.uninstall(mine) == 2
    assert cron.installed(mine) == []
    assert sorted((m.key, m.payload) for m in cron.installed(theirs)) == untouched


# -- min_lead ----------------------------------------------------------------------------------


@pytest.mark.parametrize("can_update", [True, False])
def test_occurrences_within_min_lead_are_not_created(
    cq: DelayedQueue, clock: FakeClock, can_update: bool
) -> None:
    cron = CronService(cq, min_lead=timedelta(seconds=1))
    assert cron.install_tick("h", "job", ticks(clock, 0.5, 1, 1.001, 5), can_update) == [
        IGNORED, IGNORED, CREATED, CREATED
    ]
    clock.advance(4.5)
    fired = cq.try_poll_many(10)
    assert [m.scheduled_at for m in fired] == [clock() - timedelta(seconds=3.499)]
    assert fired[0].ack()
    at_5s = ticks(clock, 0.5)  # the tick at 5 s, now 0.5 s ahead
    assert cron.install_tick("h", "job", at_5s, can_update) == [IGNORED]
    assert [m.scheduled_at for m in cron.installed("job")] == [at_5s[0].scheduled_at]
    assert cq.get(cron_key("job", "h", at_5s[0].scheduled_at)).payload == b"tick"
    cq.delete(cron_key("job", "h", at_5s[0].scheduled_at))  # fired and acked
    assert cron.install_tick("h", "job", at_5s, can_update) == [IGNORED], "not revived"
    assert cron.installed("job") == []


# -- background installers -------------------------------------------------------------------


def test_install_runs_in_background_first_run_updates_later_runs_do_not(
    cq: DelayedQueue, cron: CronService, clock: FakeClock
) -> None:
    at = clock() + timedelta(hours=1)
    cq.offer(cron_key("job", "h", at), b"stale", at)
    runs: list[datetime] = []
    run_seen = threading.Condition()

    def generate(now: datetime) -> list[CronMessage]:
        with run_seen:
            runs.append(now)
            run_seen.notify_all()
        return [CronMessage(at, b"fresh")]

    handle = cron.install("h", "job", timedelta(seconds=0.05), generate)
    try:
        assert handle.wait_first_run(WAIT_S)
        assert cq.get(cron_key("job", "h", at)).payload == b"fresh", "first run may update"
        cq.offer(cron_key("job", "h", at), b"edited", at)
        seen = len(runs)
        with run_seen:
            assert run_seen.wait_for(lambda: len(runs) >= seen + 2, WAIT_S)
    finally:
        handle.stop()
    assert handle.errors == 0 and runs[0] == clock(), "generate gets the queue's clock"
    assert cq.get(cron_key("job", "h", at)).payload == b"edited", "later runs only insert"


def test_install_periodic_tick_installs_epoch_aligned_keys(database_url: str) -> None:
    with DelayedQueue(database_url, kind="cron") as q:
        cron = CronService(q)
        started = q.now()
        handle = cron.install_periodic_tick(
            "beat_tick", timedelta(seconds=1), lambda at: at.isoformat().encode(),
            occurrences=3, window=timedelta(seconds=3), schedule_interval=timedelta(seconds=1),
        )
        try:
            assert handle.wait_first_run(WAIT_S)
            # Read the rows first: a later run (1 s on) landing between the two reads installs
            # ticks beyond first_done + 3 s, which the bound below would take for the first run's.
            first = cron.installed("beat_tick")
            first_done = q.now()
            later = wait_until(
                lambda: (rows := cron.installed("beat_tick"))
                and rows[-1].scheduled_at > first[-1].scheduled_at and rows,
                what="a later run to install the next tick",
            )
        finally:
            handle.stop()
        assert handle.errors == 0
    for rows in (first, later):
        check_periodic_rows(rows, "beat_tick")
    # The first run covers (now + min_lead, now + horizon] = (now + 1 s, now + 3 s].
    assert all(started + S < m.scheduled_at <= first_done + 3 * S for m in first)
    whole = range(int(first_done.timestamp()) + 2, int(started.timestamp()) + 4)
    assert {int(m.scheduled_at.timestamp()) for m in first} >= set(whole)


def check_periodic_rows(rows: list, prefix: str) -> None:
    """One row per second, keyed by its own epoch-aligned time, payload from payload_for."""
    times = [m.scheduled_at for m in rows]
    assert times == sorted(set(times)), "no duplicate occurrence"
    assert all(t.microsecond == 0 for t in times), "aligned on whole seconds"
    for m in rows:
        key_prefix, _, key_time = parse_cron_key(m.key)
        assert key_prefix == prefix and key_time == m.scheduled_at
        assert m.payload == m.scheduled_at.isoformat().encode()
    gaps = {b - a for a, b in zip(times, times[1:], strict=False)}
    assert gaps <= {timedelta(seconds=1)}, f"missing ticks: {times}"


@pytest.mark.slow
def test_two_installers_on_one_prefix_never_duplicate_a_tick(database_url: str) -> None:
    """Two services (own pools, as two beat processes) install while a consumer fires ticks:
    every tick fires once, and no occurrence is ever stored twice."""
    queues = [DelayedQueue(database_url, kind="cron", pool_max_size=2) for _ in range(3)]
    consumer, fired = queues[2], Counter[str]()
    handles = [
        CronService(q).install_periodic_tick(
            "race", timedelta(seconds=1), lambda at: at.isoformat().encode(), occurrences=3,
            window=timedelta(seconds=3), schedule_interval=timedelta(seconds=0.25),
        )
        for q in queues[:2]
    ]
    try:

        def fire() -> int:
            batch = consumer.try_poll_many(10)
            fired.update(e.key for e in batch)
            assert consumer.ack_many(batch) == len(batch)
            check_periodic_rows(CronService(consumer).installed("race"), "race")
            return len(fired) >= 3

        wait_until(fire, what="three ticks to fire")
    finally:
        for h in handles:
            h.stop()
        for q in queues:
            q.close()
    assert [h.errors for h in handles] == [0, 0]
    assert max(fired.values()) == 1, fired
    times = sorted(parse_cron_key(k)[2] for k in fired)
    assert {b - a for a, b in zip(times, times[1:], strict=False)} == {timedelta(seconds=1)}


# -- daily schedules and DST -----------------------------------------------------------------


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


DST_CASES = {
    # Spring forward, 2024-03-10 02:00 EST -> 03:00 EDT: 02:30 does not exist and runs at 03:30
    # EDT (07:30Z), i.e. the same offset after the gap.
    "spring-forward": (utc(2024, 3, 8, 12), [
        utc(2024, 3, 9, 6, 30), utc(2024, 3, 9, 7, 30),
        utc(2024, 3, 10, 6, 30), utc(2024, 3, 10, 7, 30),
        utc(2024, 3, 11, 5, 30), utc(2024, 3, 11, 6, 30),
        utc(2024, 3, 12, 5, 30), utc(2024, 3, 12, 6, 30),
    ]),
    # Fall back, 2024-11-03 02:00 EDT -> 01:00 EST: 01:30 happens twice and runs once, at its
    # first instant (01:30 EDT = 05:30Z).
    "fall-back": (utc(2024, 11, 1, 12), [
        utc(2024, 11, 2, 5, 30), utc(2024, 11, 2, 6, 30),
        utc(2024, 11, 3, 5, 30), utc(2024, 11, 3, 7, 30),
        utc(2024, 11, 4, 6, 30), utc(2024, 11, 4, 7, 30),
        utc(2024, 11, 5, 6, 30), utc(2024, 11, 5, 7, 30),
    ]),
}


@pytest.mark.parametrize("case", list(DST_CASES))
def test_daily_schedule_across_dst(database_url: str, case: str) -> None:
    start, expected = DST_CASES[case]
    with DelayedQueue(database_url, kind="cron", clock=FakeClock(start)) as q:
        cron = CronService(q)
        schedule = DailySchedule((time(2, 30), time(1, 30)), NY)
        handle = cron.install_daily_schedule(
            "nightly", schedule, lambda at: to_ms(at).to_bytes(8, "big"), days_ahead=4
        )
        try:
            assert handle.wait_first_run(WAIT_S)
        finally:
            handle.stop()
        assert handle.errors == 0
        rows = cron.installed("nightly")
    assert [m.scheduled_at for m in rows] == expected
    assert all(parse_cron_key(m.key)[2] == m.scheduled_at for m in rows), "UTC instants in keys"
    assert all(int.from_bytes(m.payload, "big") == m.scheduled_at_ms for m in rows)
