"""Periodic actors after an outage longer than the horizon, against real PostgreSQL.

The broker's queue runs on an injected clock, so an outage of half an hour is one assignment;
"the worker ran a row" is its deletion. The acceptance twin with real processes is
tests/acceptance/test_dramatiq_worker.py::test_periodic_catch_up_after_an_outage_longer_than_the_horizon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import dramatiq  # noqa: E402
import psycopg
import pytest
from test_beat_installer import Clock  # noqa: E402  (the injected clock of beat's tests)

from delayq_transport.core.queue import from_ms, to_ms  # noqa: E402
from delayq_transport.dramatiq import DelayqBroker  # noqa: E402
from delayq_transport.dramatiq.ledger import DramatiqLedger  # noqa: E402
from delayq_transport.dramatiq.periodic import (  # noqa: E402
    REGISTRY,
    PeriodicEntry,
    PeriodicScheduler,
    periodic,
    superseded,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
#: The scheduler is down from T0 (horizon: ten minutes, T0+1m..T0+10m) to here.
RESTART = T0 + 30 * MINUTE + timedelta(seconds=30)


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def broker(database_url: str, clock: Clock) -> Iterator[DelayqBroker]:
    b = DelayqBroker(url=database_url)
    b.queue.clock = clock  # before any with_kind clone is made: every statement uses it
    b.declare_queue("q")
    yield b
    b.close()
    for name in [n for n in REGISTRY if n.startswith("dramatiq:cu-")]:
        del REGISTRY[name]


Declare = Callable[..., dict[str, PeriodicEntry]]


@pytest.fixture
def declare(broker: DelayqBroker) -> Declare:
    """A periodic actor on queue ``q``, every minute; returns its scheduler entries."""

    def make(policy: str, grace: float = 10.0, tag: str = "") -> dict[str, PeriodicEntry]:
        def tick() -> None:
            pass

        name = f"dramatiq:cu-{policy}{tag}"
        actor = dramatiq.actor(tick, actor_name=f"cu_{policy}{tag}", queue_name="q",
                               broker=broker)
        periodic(every=60, misfire=policy, grace=grace, name=name)(actor)
        return {name: REGISTRY[name]}

    return make


def scheduler(broker: DelayqBroker, entries: dict[str, PeriodicEntry]) -> PeriodicScheduler:
    return PeriodicScheduler(broker, refresh_interval=60, horizon=600, entries=entries)


def rows(broker: DelayqBroker) -> list[tuple[datetime, datetime]]:
    """(occurrence, scheduledAt) of every row of queue q, oldest occurrence first."""
    with psycopg.connect(broker.db.url) as conn:
        found = conn.execute(
            'SELECT "scheduledAtInitially", "scheduledAt" FROM delayed_queue '
            "WHERE \"pKind\" = 'dramatiq:q' ORDER BY 1").fetchall()
    return [(from_ms(a), from_ms(b)) for a, b in found]


def due(broker: DelayqBroker, now: datetime) -> list[datetime]:
    return [at for at, scheduled in rows(broker) if scheduled <= now]


def run_due(broker: DelayqBroker, now: datetime) -> None:
    """What a worker that stayed up did: every due row ran (and was acked)."""
    with psycopg.connect(broker.db.url) as conn:
        conn.execute("DELETE FROM delayed_queue WHERE \"pKind\" = 'dramatiq:q' "
                     'AND "scheduledAt" <= %s', (to_ms(now),))


def outage(broker: DelayqBroker, clock: Clock, entries: dict[str, PeriodicEntry],
           workers_up: bool = True) -> PeriodicScheduler:
    """Install at T0, run what falls due while no scheduler runs, restart at RESTART."""
    scheduler(broker, entries).refresh()
    assert rows(broker)[-1][0] == T0 + 10 * MINUTE  # the horizon the outage outlasts
    clock.now = RESTART
    if workers_up:
        run_due(broker, clock.now)
    assert due(broker, clock.now) == ([] if workers_up else
                                      [T0 + i * MINUTE for i in range(1, 11)])
    restarted = scheduler(broker, entries)
    restarted.refresh()
    return restarted


@pytest.mark.parametrize("policy,runs", [
    ("coalesce", [30]),                  # one run for the whole gap: its newest occurrence
    ("skip", []),                        # every gap occurrence is more than grace late
    ("run_all", list(range(11, 31))),    # all twenty, late
])
def test_the_policy_applies_to_occurrences_never_installed(
        broker: DelayqBroker, clock: Clock, declare: Declare, policy: str,
        runs: list[int]) -> None:
    entries = declare(policy)
    restarted = outage(broker, clock, entries)
    expected = [T0 + i * MINUTE for i in runs]
    assert due(broker, RESTART) == expected
    # Due at restart (not at their old times), and the new horizon follows.
    assert all(scheduled == RESTART for at, scheduled in rows(broker) if at in expected)
    assert [at for at, _ in rows(broker) if at > RESTART] == \
        [T0 + i * MINUTE for i in range(31, 41)]
    assert restarted.installer.caught_up == {next(iter(entries)): expected}
    [ledger] = DramatiqLedger(broker.db, broker.table).installed()
    assert ledger.installed_until_ms == to_ms(T0 + 40 * MINUTE)
    # The gap is closed: neither the same scheduler nor a new one catches it up again.
    run_due(broker, RESTART)
    restarted.refresh()
    scheduler(broker, entries).refresh()
    assert due(broker, RESTART) == []


@pytest.mark.parametrize("policy", ["coalesce", "skip"])
def test_gap_occurrences_still_within_grace_run_as_installed_ones_would(
        broker: DelayqBroker, clock: Clock, declare: Declare, policy: str) -> None:
    # Restart 30 s after T0+30m with 120 s of grace: T0+29m and T0+30m are only late.
    outage(broker, clock, declare(policy, grace=120))
    assert due(broker, RESTART) == [T0 + 29 * MINUTE, T0 + 30 * MINUTE]


@pytest.mark.parametrize("policy,runs", [("coalesce", [30]), ("skip", [])])
def test_with_workers_down_too_the_stale_rows_and_the_gap_run_once(
        broker: DelayqBroker, clock: Clock, declare: Declare, policy: str,
        runs: list[int]) -> None:
    """Nothing ran: the ten installed rows wait, misfired, next to the gap never installed."""
    outage(broker, clock, declare(policy), workers_up=False)
    assert due(broker, RESTART) == [T0 + i * MINUTE for i in runs]


def test_a_scheduler_that_read_the_ledger_before_the_catch_up_does_not_repeat_it(
        broker: DelayqBroker, clock: Clock, declare: Declare) -> None:
    """The catch-up's row has the key of its occurrence; once it ran (deleted), only the
    ledger's compare-and-set stops a scheduler with an older view from inserting it again."""
    entries = declare("coalesce")
    scheduler(broker, entries).refresh()
    clock.now = RESTART
    run_due(broker, clock.now)
    before = DramatiqLedger(broker.db, broker.table).installed()
    late = scheduler(broker, entries)
    late.installer.store.installed = lambda: before  # type: ignore[method-assign]
    scheduler(broker, entries).refresh()
    assert due(broker, RESTART) == [T0 + 30 * MINUTE]
    run_due(broker, RESTART)  # the catch-up ran
    report = late.refresh()
    assert due(broker, RESTART) == [] and late.installer.caught_up == {}
    assert not report.errors


def test_a_changed_entry_after_an_outage_starts_afresh(
        broker: DelayqBroker, clock: Clock, declare: Declare) -> None:
    entries = declare("coalesce")
    scheduler(broker, entries).refresh()
    clock.now = RESTART
    run_due(broker, clock.now)
    [(name, entry)] = entries.items()
    periodic(every=60, misfire="coalesce", grace=30, name=name)(entry.actor)  # another hash
    changed = {name: REGISTRY[name]}
    report = scheduler(broker, changed).refresh()
    assert report.replaced == list(changed) and due(broker, RESTART) == []


def test_a_worker_back_before_any_scheduler_runs_the_outage_once(
        broker: DelayqBroker, clock: Clock, declare: Declare) -> None:
    """Everything was down: the worker comes back first and finds the ten stale rows. It must
    not run the newest of them (T0+10m) when newer occurrences passed uninstalled, or the
    outage runs twice: once there, once as the scheduler's catch-up."""
    entries = declare("coalesce")
    scheduler(broker, entries).refresh()
    clock.now = RESTART
    consumer = broker.consume("q", prefetch=20, timeout=200)
    try:
        assert next(consumer) is None  # every stale row dropped, none handed to the worker
    finally:
        consumer.close()
    assert due(broker, RESTART) == []
    scheduler(broker, entries).refresh()
    # A fresh consumer polls at once (the first one would wait for the injected clock's due
    # time on the real clock).
    consumer = broker.consume("q", prefetch=20, timeout=200)
    try:
        proxy = next(consumer)
        assert proxy is not None and proxy.message_timestamp == to_ms(T0 + 30 * MINUTE)
        consumer.ack(proxy)
        assert next(consumer) is None
    finally:
        consumer.close()


def test_superseded_only_drops_what_it_can_check(
        broker: DelayqBroker, declare: Declare) -> None:
    [entry] = declare("coalesce").values()
    from delayq_beat.entries import entry_hash

    info = {"entry": entry.spec.name, "hash": entry_hash(entry.spec, entry.zone),
            "at_ms": to_ms(T0), "misfire": "coalesce", "grace_ms": 10_000}
    now = to_ms(T0 + MINUTE)  # the next occurrence is just past
    assert superseded(info, now)
    assert not superseded(info, now - 1)  # not past yet: this one is still the newest
    assert not superseded({**info, "hash": "other"}, now)  # another config: not checked
    assert not superseded({**info, "misfire": "skip"}, now)  # drop_misfired's business
    assert not superseded({**info, "entry": "dramatiq:unknown"}, now)
    assert not superseded({**info, "at_ms": "x"}, now)
    assert not superseded({**info, "grace_ms": 120_000}, now)  # on time
