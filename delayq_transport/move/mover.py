"""The move: a source broker's waiting Celery messages into delayq's table, each exactly once.

Order of operations, per batch, and why a crash at any point loses or doubles nothing:

1. **take** the batch out of consumers' reach, still held by the source (Redis: ``LMOVE``
   into the move's staging list; RabbitMQ: ``basic_get`` without ack). A crash here leaves
   it staged (the next run starts with the staging lists) or unacknowledged (RabbitMQ puts it
   back when the connection drops).
2. **offer** it with ``DelayedQueue.offer_once``: each row is inserted together with the
   message's source id in the run ledger, in one transaction. A crash before the commit left
   nothing in delayq; after it, the message is in both places, and the next run's offer finds
   its id recorded and writes nothing, even if a delayq worker already ran and acked the row.
3. **settle**: remove the batch from the source, keeping there the messages the move refused
   (one ``MULTI``/``EXEC`` on Redis; acks confirmed by a synchronous call on RabbitMQ).
4. **forget** the batch's ids (the source no longer holds those messages). A crash before this
   leaves ids nobody will ask about again.

Before any of it, the move refuses to start while a consumer is attached to the source (a
live worker holds prefetched and ETA messages no one else can take) or another move runs,
and gives dead workers' unacknowledged Redis messages back (into the staging lists, so step 2
onwards applies to them too).

``DELAYQ_MOVE_CRASH=<point>:<n>`` (tests only) kills this process with SIGKILL at ``restored``,
``staged``, ``offered`` or ``removed`` once ``n`` messages have passed that point, between two
steps. ``DELAYQ_MOVE_CRASH=inside:<step>:<n>`` kills it inside a step instead (``restore``,
``take``, ``offer``, ``settle`` or ``forget``): at the ``n``-th Python call or return made while
that step runs (counted over every batch; libpq, Redis and AMQP calls included), so a seeded
``n`` lands between any two operations of the step, e.g. after a commit and before the next
line. It names that step on stderr first.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from ..core.queue import DelayedQueue, OnceOffer, OnceOutcome
from ..formats import celery as celery_message
from .convert import NotMovable, SourceMessage, to_offer
from .source import Batch, Leftover, MoveRefused, Source, SourceCounts

CRASH_ENV = "DELAYQ_MOVE_CRASH"
DEFAULT_BATCH_SIZE = 500


@dataclass
class QueueMove:
    """What happened to one queue."""

    queue: str
    kinds: list[str]
    before: SourceCounts
    delayq_before: int
    after: SourceCounts | None = None
    delayq_after: int | None = None
    #: Inserted by this run.
    moved: int = 0
    #: Already in delayq (an interrupted run had offered them): removed from the source only.
    already: int = 0
    restored: int = 0
    refused: list[Leftover] = field(default_factory=list)
    #: Dry run: what would move due now, with an ETA ahead, and those ETAs' range.
    due: int = 0
    scheduled: int = 0
    first_eta: datetime | None = None
    last_eta: datetime | None = None


class CrashPoints:
    """The test hooks of the module docstring (nothing runs without ``DELAYQ_MOVE_CRASH``)."""

    def __init__(self, spec: str | None = None) -> None:
        spec = spec if spec is not None else os.environ.get(CRASH_ENV, "")
        self.point, _, n = spec.partition(":")
        #: ``inside``: the step to kill in.
        self.target = ""
        if self.point == "inside":
            self.target, _, n = n.partition(":")
        self.left = int(n or 0)
        #: The step the move is in.
        self.step = ""

    def passed(self, point: str, count: int) -> None:
        if point == self.point and count:
            self.left -= count
            if self.left <= 0:
                os.kill(os.getpid(), signal.SIGKILL)

    def enter(self, step: str) -> None:
        """The move starts ``step`` (of this thread: the move's)."""
        self.step = step
        if self.target and step == self.target and sys.getprofile() is None:
            sys.setprofile(self._count)

    def _count(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.step != self.target:
            return
        self.left -= 1
        if self.left <= 0:
            os.write(2, f"{CRASH_ENV}: killed inside step {self.step}\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)


class Mover:
    def __init__(self, source: Source, queue: DelayedQueue, *,
                 steps: Sequence[int] = celery_message.PRIORITY_STEPS,
                 batch_size: int = DEFAULT_BATCH_SIZE,
                 progress: Callable[[str], None] = lambda _: None) -> None:
        self.source = source
        self.queue = queue
        self.steps = tuple(steps)
        self.batch_size = batch_size
        self.progress = progress
        self.crash = CrashPoints()

    def check(self, wanted: Sequence[str]) -> list[QueueMove]:
        """The queues to move and their counts; MoveRefused while something consumes them."""
        queues = self.source.queues(wanted)
        if not queues:
            raise MoveRefused(f"no queue to move on {self.source.display} (name them with "
                              "--queue)")
        blockers = self.source.blockers(queues)
        if blockers:
            raise MoveRefused(
                f"{self.source.display} is still being consumed; stop every worker (and "
                "anything else that consumes these queues) before moving, e.g. `celery -A "
                "<app> control shutdown` or SIGTERM to each worker, then run again:\n  "
                + "\n  ".join(blockers))
        counts = self.source.counts(queues)
        return [QueueMove(q, self._kinds(q), counts[q], self._waiting(q)) for q in queues]

    def _kinds(self, queue: str) -> list[str]:
        return celery_message.kinds_for(queue, self.steps)

    def _waiting(self, queue: str) -> int:
        return self.queue.count_waiting(self._kinds(queue))

    def preview(self, moves: list[QueueMove]) -> None:
        """Dry run: classify what would move, without taking anything."""
        for move in moves:
            for item in self.source.preview(move.queue):
                try:
                    offer = to_offer(item, self.steps)
                except NotMovable as exc:
                    move.refused.append(Leftover(move.queue, item.task_id(), str(exc)))
                    continue
                self._plan(move, offer)

    @staticmethod
    def _plan(move: QueueMove, offer: OnceOffer) -> None:
        at = offer.scheduled_at
        if at is None or at <= datetime.now(UTC):
            move.due += 1
            return
        move.scheduled += 1
        move.first_eta = at if move.first_eta is None else min(move.first_eta, at)
        move.last_eta = at if move.last_eta is None else max(move.last_eta, at)

    def run(self, moves: list[QueueMove]) -> None:
        self.crash.enter("restore")
        restored = self.source.restore_unacked([m.queue for m in moves])
        self.crash.passed("restored", sum(restored.values()))
        for move in moves:
            move.restored = restored.get(move.queue, 0)
            self.crash.enter("take")
            for batch in self.source.batches(move.queue, self.batch_size):
                self._move_batch(move, batch)
                self.crash.enter("take")  # the next batch
            self.crash.enter("finish")
            self.source.finish(move.queue)
            self.progress(f"{move.queue}: moved {move.moved}"
                          + (f" (+{move.already} offered by an interrupted run)"
                             if move.already else "")
                          + (f", {len(move.refused)} left in the source" if move.refused
                             else ""))
        counts = self.source.counts([m.queue for m in moves])
        for move in moves:
            move.after, move.delayq_after = counts[move.queue], self._waiting(move.queue)

    def _move_batch(self, move: QueueMove, batch: Batch) -> None:
        self.crash.passed("staged", len(batch.items))
        keep: list[int] = []
        offers: list[tuple[int, OnceOffer]] = []
        for i, item in enumerate(batch.items):
            try:
                offers.append((i, to_offer(item, self.steps)))
            except NotMovable as exc:
                self._refuse(move, keep, i, item, str(exc))
        self.crash.enter("offer")
        outcomes = self.queue.offer_once([o for _, o in offers])
        stored = []
        for (i, offer), outcome in zip(offers, outcomes, strict=True):
            if outcome is OnceOutcome.CONFLICT:
                self._refuse(move, keep, i, batch.items[i],
                             f"task id already in delayq (kind {offer.kind!r}) with another "
                             "message: left in the source")
                continue
            stored.append(offer.once_id)
            if outcome is OnceOutcome.CREATED:
                move.moved += 1
            else:
                move.already += 1
        self.crash.passed("offered", len(batch.items))
        self.crash.enter("settle")
        self.source.settle(batch, keep)
        self.crash.passed("removed", len(batch.items))
        self.crash.enter("forget")
        self.queue.forget_once(stored)
        self.crash.enter("")

    @staticmethod
    def _refuse(move: QueueMove, keep: list[int], i: int, item: SourceMessage,
                reason: str) -> None:
        keep.append(i)
        move.refused.append(Leftover(move.queue, item.task_id(), reason))
