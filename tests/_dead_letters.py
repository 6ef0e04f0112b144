"""Dramatiq dead letters as a worker makes them: each message sent, taken and nacked with a
real exception through delayq's broker (the tests of the failure lists, the page and the
admin)."""

from __future__ import annotations

from typing import Any


def dead_letters(url: str, messages: list[tuple[str, Any]], queue: str = "default",
                 retries: int = 3) -> None:
    """One dead letter per (actor, argument); its exception says ``<actor> broke: <arg>``."""
    from dramatiq.message import Message

    from delayq_transport.dramatiq import DelayqBroker

    broker = DelayqBroker(url=url)
    try:
        broker.declare_queue(queue)
        for actor, arg in messages:
            broker.enqueue(Message(queue_name=queue, actor_name=actor, args=(arg,), kwargs={},
                                   options={"retries": retries}))
        consumer = broker.consume(queue, prefetch=len(messages), timeout=2000)
        for _ in messages:
            proxy = next(consumer)
            assert proxy is not None
            try:
                raise RuntimeError(f"{proxy.actor_name} broke: {proxy.args[0]}")
            except RuntimeError as exc:
                proxy.stuff_exception(exc)
            consumer.nack(proxy)
        consumer.close()
    finally:
        broker.close()
