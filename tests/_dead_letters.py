"""Dramatiq dead letters as a worker makes them: each message sent, taken and nacked with a
real exception through delayq's broker (the tests of the failure lists, the page and the
admin); and what the tests of the dead-letter policy (formats/deadletters.py) read with real
workers of each front end: the CLI's listing, and rows its expiry must leave alone."""

from __future__ import annotations

from collections.abc import Callable
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


def listed(url: str, front_end: str) -> list[dict[str, Any]]:
    """One front end's dead letters as ``delayq tasks dead-letters list --json`` prints them,
    run as an operator runs it (but the bystander's, queue ``kept``)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "delayq_transport", "-d", url, "tasks",
                           "dead-letters", "list", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return [d for d in json.loads(done.stdout)["dead_letters"]
            if d["front_end"] == front_end and d["queue"] != "kept"]


def bystanders(url: str) -> Callable[[], list[tuple[str, str]]]:
    """Rows the dead-letter expiry must leave alone: a due message of a queue nobody consumes
    and another front end's dead letter still in its retention. Returns what is left of them,
    as (kind, key)."""
    from delayq_transport.core.queue import DelayedQueue, dead_letter

    with DelayedQueue(url, kind="bystander") as queue:
        queue.offer("due-now", b"{}")
        queue.with_kind("kept").offer("kept-a-day", b"{}")
        held = queue.with_kind("kept").try_poll_many(1)
        assert dead_letter(queue, held, "dramatiq:kept.XQ", 86400) == 1

    def left() -> list[tuple[str, str]]:
        with DelayedQueue(url, kind="bystander") as queue:
            found = queue.get("due-now"), queue.with_kind("dramatiq:kept.XQ").get("kept-a-day")
        return [(m.kind, m.key) for m in found if m is not None]

    assert left() == [("bystander", "due-now"), ("dramatiq:kept.XQ", "kept-a-day")]
    return left
