"""offer_once (core/queue/once.py): a message offered again after a crash of its mover is written
once, whether its row still waits, was consumed since, or its key holds another message."""

from __future__ import annotations

import multiprocessing
import random
from datetime import UTC, datetime, timedelta

import pytest

from delayq_transport import DelayedQueue
from delayq_transport.core import InvalidInput
from delayq_transport.core.queue import OnceOffer, OnceOutcome, due_ms

C, R, SAME, X = (OnceOutcome.CREATED, OnceOutcome.RECORDED, OnceOutcome.IDENTICAL,
              OnceOutcome.CONFLICT)


def item(n: int, *, key: str | None = None, payload: bytes | None = None,
         kind: str = "test", at: datetime | None = None) -> OnceOffer:
    return OnceOffer(f"src/{n}", key or f"task-{n}", kind, payload or f"p{n}".encode(), at)


def rows(queue: DelayedQueue, kinds: list[str]) -> int:
    return queue.count_waiting(kinds)


def test_a_reoffer_writes_nothing_while_the_row_waits_or_after_it_ran(
        queue: DelayedQueue) -> None:
    later = datetime.now(UTC) + timedelta(days=2)
    assert queue.offer_once([item(1), item(2, at=later)]) == [C, C]
    assert queue.get("task-2").scheduled_at_ms == due_ms(later)  # never before it
    # the due one is run and acked: a re-offer of both (the mover crashed before removing
    # them from its source) writes nothing, neither the consumed row nor the waiting one
    [env] = queue.try_poll_many(10)
    assert env.key == "task-1"
    queue.ack(env)
    assert queue.offer_once([item(1), item(2, at=later)]) == [R, R]
    assert rows(queue, ["test"]) == 1 and not queue.contains("task-1")


def test_a_taken_key_is_identical_or_a_conflict_and_a_conflict_records_nothing(
        queue: DelayedQueue) -> None:
    queue.offer("task-1", b"p1")  # the very message, published (or moved) without a ledger
    queue.offer("task-2", b"another message under this task id")
    assert queue.offer_once([item(1), item(2)]) == [SAME, X]
    assert queue.get("task-2").payload == b"another message under this task id"
    assert rows(queue, ["test"]) == 2
    # the conflict left no record: once its key is free, the message is offered for real
    assert queue.delete("task-2")
    assert queue.offer_once([item(2)]) == [C]
    assert queue.get("task-2").payload == b"p2"


def test_repeats_within_one_call(queue: DelayedQueue) -> None:
    same_id = [item(1), item(1)]
    same_key_other_payload = [item(2), OnceOffer("src/3", "task-2", "test", b"other")]
    same_key_same_payload = [item(4), OnceOffer("src/5", "task-4", "test", b"p4")]
    other_kind = [OnceOffer("src/6", "task-4", "test\x06\x163", b"p4")]
    out = queue.offer_once(same_id + same_key_other_payload + same_key_same_payload + other_kind)
    assert out == [C, R, C, X, C, SAME, C]
    assert rows(queue, ["test", "test\x06\x163"]) == 4
    assert queue.get("task-2").payload == b"p2"


def test_forget_then_reoffer_and_validation(queue: DelayedQueue) -> None:
    assert queue.offer_once([item(1)]) == [C]
    [env] = queue.try_poll_many(1)
    queue.ack(env)
    assert queue.forget_once(["src/1", "src/1", "src/unknown"]) == 1
    assert queue.offer_once([item(1)]) == [C]  # forgotten: the caller said it left its source
    with pytest.raises(InvalidInput, match="once_id"):
        queue.offer_once([item(3), OnceOffer("", "k", "test", b"x")])
    assert not queue.contains("task-3")  # validated before anything is sent


def _offer_all(url: str, n: int, seed: int, out: multiprocessing.Queue) -> None:
    items = [item(i) for i in range(n)]
    random.Random(seed).shuffle(items)
    with DelayedQueue(url, kind="test", ensure_schema=False) as q:
        created = 0
        for start in range(0, n, 250):
            created += q.offer_once(items[start:start + 250]).count(C)
    out.put(created)


def test_concurrent_movers_create_each_message_once(database_url: str,
                                                    queue: DelayedQueue) -> None:
    n, procs = 3000, 3
    out: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_offer_all, args=(database_url, n, seed, out))
               for seed in range(procs)]
    for w in workers:
        w.start()
    created = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert sum(created) == n
    assert rows(queue, ["test"]) == n
