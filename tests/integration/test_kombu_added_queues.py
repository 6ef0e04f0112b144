"""A queue a running kombu connection starts to consume later is polled at once (issue 49,
item 8).

Its waiting messages were published before the consumer existed, so no NOTIFY will announce
them again: unless adding the queue polls, they wait for the fallback poll. Like kombu's own
``TestExchangeTypes::test_fanout`` (publish to two queues, consume one, then the other on the
same connection), under both faces of the consumer session: kombu's blocking
``drain_events`` and the hub a Celery worker runs. The consumers' fallback poll is 30 s, so a
delivery within the bound can only come from the added queue being polled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import kombu
import pytest
from kombu.asynchronous.hub import Hub

pytestmark = pytest.mark.timeout(60)
pytest_plugins = ("_kombu_env",)

Connect = Callable[..., kombu.Connection]
#: The fallback poll of the consumers below: far longer than any wait a test accepts.
SLOW_POLL_S = 30.0
#: How long an added queue's waiting message may take to arrive.
PICKUP_BOUND_S = 2.0


def publish(conn: kombu.Connection, *names: str) -> None:
    """One message per queue, each declared (and bound) by the publish."""
    producer = kombu.Producer(conn.default_channel)
    for name in names:
        queue = kombu.Queue(name, routing_key=name)
        producer.publish([name], routing_key=name, declare=[queue])


def consume(channel: Any, name: str, got: list[str]) -> kombu.Consumer:
    """Start consuming ``name`` on ``channel``; each body is recorded and acked."""
    def on_message(body: Any, message: kombu.Message) -> None:
        got.append(body[0])
        message.ack()

    consumer = kombu.Consumer(channel, [kombu.Queue(name, routing_key=name)],
                              callbacks=[on_message])
    consumer.consume()
    return consumer


def run_hub(hub: Hub, until: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        hub.run_once()


def receive(conn: kombu.Connection, hub: Hub | None, got: list[str], count: int) -> None:
    """Wait, at most PICKUP_BOUND_S, until ``count`` messages were received."""
    if hub is not None:
        run_hub(hub, lambda: len(got) >= count, PICKUP_BOUND_S)
        return
    deadline = time.monotonic() + PICKUP_BOUND_S
    while len(got) < count:
        try:
            conn.drain_events(timeout=max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            return


@pytest.mark.parametrize("channel", ["same channel", "another channel"])
@pytest.mark.parametrize("face", ["drain_events", "hub"])
def test_a_queue_consumed_later_on_a_running_connection_is_polled_at_once(
    face: str, channel: str, kombu_connect: Connect
):
    got: list[str] = []
    hub = Hub() if face == "hub" else None
    with kombu_connect(polling_interval=SLOW_POLL_S) as conn:
        publish(conn, "first", "second")
        if hub is not None:
            conn.register_with_event_loop(hub)
        first = consume(conn.default_channel, "first", got)
        receive(conn, hub, got, 1)
        assert got == ["first"]

        other = conn.default_channel if channel == "same channel" else conn.channel()
        second = consume(other, "second", got)
        receive(conn, hub, got, 2)  # on the loop's thread, as Celery's add_consumer does

        assert got == ["first", "second"], (
            f"the added queue's message did not come within {PICKUP_BOUND_S}s "
            f"(the fallback poll is {SLOW_POLL_S}s)")
        second.cancel()
        first.cancel()
    if hub is not None:
        hub.close()
