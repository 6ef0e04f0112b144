"""Periodic actors without a database: decorator order, and which never-installed occurrences
a misfire policy runs after an outage (delayq_transport/scheduling/catchup.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import dramatiq  # noqa: E402
import pytest
from dramatiq.brokers.stub import StubBroker  # noqa: E402

from delayq_transport.dramatiq.periodic import REGISTRY, periodic  # noqa: E402
from delayq_transport.scheduling.catchup import catch_up_times  # noqa: E402
from delayq_transport.scheduling.entries import make_spec  # noqa: E402
from delayq_transport.scheduling.schedules import parse_crontab  # noqa: E402
from delayq_transport.scheduling.times import (  # noqa: E402
    newer_occurrence_passed,
    newest_occurrences,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@pytest.fixture
def broker() -> Iterator[StubBroker]:
    b = StubBroker()
    yield b
    b.close()
    for name in [n for n in REGISTRY if n.startswith("dramatiq:order-")]:
        del REGISTRY[name]


def test_periodic_below_the_actor_decorator_fails_at_import_naming_the_fix(
        broker: StubBroker) -> None:
    with pytest.raises(TypeError, match="above @dramatiq.actor") as caught:
        @dramatiq.actor(broker=broker)
        @periodic(every=60, name="dramatiq:order-below")
        def report() -> None: ...

    assert "@periodic(...)\n    @dramatiq.actor(...)\n    def report(" in str(caught.value)
    assert "dramatiq:order-below" not in REGISTRY
    assert "report" not in broker.actors  # the error came before Dramatiq saw the function


def test_periodic_above_the_actor_decorator_registers_it(broker: StubBroker) -> None:
    @periodic(every=60, name="dramatiq:order-above")
    @dramatiq.actor(broker=broker, queue_name="reports")
    def report() -> None: ...

    assert isinstance(report, dramatiq.Actor)
    entry = REGISTRY["dramatiq:order-above"]
    assert entry.actor is report and entry.spec.options["queue"] == "reports"


def test_a_generic_actor_is_an_actor_too(broker: StubBroker) -> None:
    # A GenericActor subclass becomes an instance that forwards to its actor (``__actor__``).
    meta = type("Meta", (), {"broker": broker, "actor_name": "generic_report"})
    generic = type("Report", (dramatiq.GenericActor,), {"Meta": meta,
                                                        "perform": lambda self: None})
    assert periodic(every=60, name="dramatiq:order-generic")(generic) is generic
    assert REGISTRY["dramatiq:order-generic"].spec.task == "generic_report"


def spec(policy: str, sched: object = 60.0, grace: float = 10.0):  # type: ignore[no-untyped-def]
    return make_spec("e", "tick", sched, options={"delayq_misfire": policy,
                                                  "delayq_grace": grace})


@pytest.mark.parametrize("policy,grace,expected", [
    ("coalesce", 10.0, [30]),        # one run: the newest missed occurrence
    ("skip", 10.0, []),              # all more than grace late
    ("run_all", 10.0, list(range(11, 31))),
    ("coalesce", 120.0, [29, 30]),   # within grace they are only late, as installed ones
    ("skip", 120.0, [29, 30]),
])
def test_catch_up_times_by_policy(policy: str, grace: float, expected: list[int]) -> None:
    now = T0 + 30 * MINUTE + timedelta(seconds=30)
    runs = catch_up_times(spec(policy, grace=grace), UTC, T0 + 10 * MINUTE,
                          now + timedelta(seconds=1), now)
    assert runs == [T0 + i * MINUTE for i in expected]


def test_coalesce_keeps_the_misfired_newest_next_to_an_upcoming_one() -> None:
    """A gap that ends just after an occurrence still to come: that one is on time, and the
    newest one already due (misfired) is still the catch-up run, as for installed rows."""
    now = T0 + 30 * MINUTE - timedelta(milliseconds=500)
    runs = catch_up_times(spec("coalesce"), UTC, T0, now + timedelta(seconds=1), now)
    assert runs == [T0 + 29 * MINUTE, T0 + 30 * MINUTE]


def test_a_long_gap_is_searched_from_its_end() -> None:
    """A year of a one-second interval: only its newest occurrences are computed."""
    every_second = spec("coalesce", 1.0).schedule
    end = T0 + timedelta(days=365)
    assert newest_occurrences(every_second, UTC, T0, end, 3) == \
        [end - timedelta(seconds=2), end - timedelta(seconds=1), end]
    assert len(catch_up_times(spec("run_all", 1.0), UTC, T0, end, end)) == 1000  # capped


def test_crontab_gaps_follow_the_entry_zone() -> None:
    paris = ZoneInfo("Europe/Paris")
    weekdays = spec("coalesce", parse_crontab("30 7 * * mon-fri"))
    now = datetime(2030, 1, 7, 12, 0, tzinfo=paris)  # a Monday, noon
    [run] = catch_up_times(weekdays, paris, now - timedelta(days=10), now, now)
    assert run == datetime(2030, 1, 7, 7, 30, tzinfo=paris)
    # Back on Monday at 07:29 after Saturday noon: the gap held no occurrence.
    early = datetime(2030, 1, 7, 7, 29, tzinfo=paris)
    assert catch_up_times(weekdays, paris, now - timedelta(days=2), early + timedelta(
        seconds=1), early) == []


def test_newer_occurrence_passed() -> None:
    every_minute = spec("coalesce").schedule
    at = int(T0.timestamp() * 1000)
    assert newer_occurrence_passed(every_minute, UTC, at, at + 60_000)
    assert not newer_occurrence_passed(every_minute, UTC, at, at + 59_999)
