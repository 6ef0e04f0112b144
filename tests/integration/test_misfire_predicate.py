"""One misfire predicate for every front end (delayq_transport/scheduling/misfire.py,
``dropped``): the same late occurrences, written by Celery beat's, Dramatiq's and django.tasks'
deliveries and polled from real rows, are dropped alike by the kombu channel's, the Dramatiq
consumer's and the django.tasks worker's session predicate, on the database's clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import dramatiq
import pytest

from delayq_beat.installer import CeleryDelivery
from delayq_transport.core.queue import DelayedQueue, Envelope, Offer
from delayq_transport.django.periodic import TaskDelivery, misfired_occurrences
from delayq_transport.dramatiq import DelayqBroker
from delayq_transport.dramatiq.consumer import misfired_periodic
from delayq_transport.dramatiq.periodic import DramatiqDelivery
from delayq_transport.formats.celery import encode, task_message
from delayq_transport.scheduling.entries import EntrySpec, entry_hash, make_spec
from delayq_transport.scheduling.plans import Delivery, Occurrence
from delayq_transport.transport.channel import misfired_beats

MINUTE = timedelta(minutes=1)
Predicate = Callable[[list[Envelope]], list[Envelope]]


@pytest.fixture
def broker(database_url: str) -> Iterator[DelayqBroker]:
    b = DelayqBroker(url=database_url)
    dramatiq.set_broker(b)
    yield b
    b.close()


def front_end(name: str, broker: DelayqBroker, policy: str
              ) -> tuple[EntrySpec, Delivery, Predicate]:
    """An entry of ``policy`` (grace 10 s) as the front end declares it, its delivery and its
    consumer's predicate."""
    misfire = {"delayq_misfire": policy, "delayq_grace": 10}
    if name == "celery":
        return (make_spec("m", "tasks.tick", 60.0, options=misfire), CeleryDelivery(),
                misfired_beats(broker.queue))
    if name == "dramatiq":
        return (make_spec("dramatiq:m", "tick", 60.0, options={"queue": "q", **misfire},
                          source="dramatiq"), DramatiqDelivery(), misfired_periodic(broker))
    options = {"queue": "default", "priority": 0, "backend": "default", **misfire}
    return (make_spec("m", "shop.djtasks.record", 60.0, options=options, source="django"),
            TaskDelivery(), misfired_occurrences(broker.queue))


def installed_late(queue: DelayedQueue, spec: EntrySpec, delivery: Delivery) -> str:
    """Five occurrences a minute apart, the newest 30 s ago, left waiting by an outage of
    every worker (written as a scheduler would have); returns their kind."""
    from zoneinfo import ZoneInfo

    zone = ZoneInfo("UTC")
    route = delivery.route(spec)
    now = queue.now()
    times = [now - timedelta(seconds=30) - (4 - i) * MINUTE for i in range(5)]
    hash_ = entry_hash(spec, zone)
    occurrences = [Occurrence(spec, route, hash_, at, at + MINUTE) for at in times]
    queue.with_kind(route.kind).offer_batch(
        [Offer(o.key, delivery.encode(o), o.at) for o in occurrences])
    return str(route.kind)


@pytest.mark.parametrize("name", ["celery", "dramatiq", "django"])
@pytest.mark.parametrize(("policy", "runs"), [("coalesce", [4]), ("skip", []),
                                              ("run_all", [0, 1, 2, 3, 4])])
def test_every_front_end_drops_the_same_misfired_occurrences(
        broker: DelayqBroker, name: str, policy: str, runs: list[int]) -> None:
    spec, delivery, predicate = front_end(name, broker, policy)
    kind = installed_late(broker.queue, spec, delivery)
    envs = broker.queue.try_poll_many(100, [kind])
    assert len(envs) == 5
    dropped = {e.id for e in predicate(envs)}
    order = sorted(envs, key=lambda e: e.scheduled_at)
    assert [i for i, e in enumerate(order) if e.id not in dropped] == runs


def test_other_rows_and_undecodable_payloads_are_delivered(broker: DelayqBroker) -> None:
    """A task that is no occurrence, or a payload that only mentions the header's name (not a
    message of the front end), is never dropped: the front end reports what it cannot decode."""
    q = broker.queue.with_kind("celery")
    q.offer_batch([Offer("plain", encode(task_message("tasks.x")), None),
                   Offer("mention", b'not json "delayq_beat" "delayq_periodic"', None)])
    envs = q.try_poll_many(10, ["celery"])
    assert len(envs) == 2
    for predicate in (misfired_beats(broker.queue), misfired_periodic(broker),
                      misfired_occurrences(broker.queue)):
        assert predicate(envs) == []
