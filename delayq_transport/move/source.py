"""What the mover needs from a source broker, and what it reports about one.

A source hands out **batches** of messages that are out of its consumers' reach but still
held by the source (Redis: in a staging list of the mover's own; RabbitMQ: taken with
``basic_get`` and not acknowledged), and **settles** a batch once delayq holds its messages:
only then does it remove them, keeping those the move refused where they were. The order
makes every crash safe (see :mod:`.mover`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core import DelayqError
from .convert import SourceMessage


class MoveRefused(DelayqError):
    """The move cannot start (live consumers, another mover, an unknown source); nothing was
    changed."""


@dataclass
class SourceCounts:
    """Messages of one queue at its source."""

    #: In the queue, ready for a consumer (RabbitMQ: its message_count).
    waiting: int
    #: Taken by a worker that is gone and never acknowledged (Redis' ``unacked``).
    unacked: int = 0
    #: Taken by an interrupted ``move-from`` (Redis), finished by the next run.
    staged: int = 0

    @property
    def total(self) -> int:
        return self.waiting + self.unacked + self.staged


@dataclass
class Batch:
    """Messages the mover took from ``where`` (a list, a queue); ``handles`` are the source's
    own references to them."""

    where: str
    items: list[SourceMessage]
    handles: list[Any] = field(default_factory=list)


@dataclass
class Leftover:
    """Something the source holds that the move leaves alone, and why."""

    queue: str
    what: str
    reason: str


class Source(Protocol):
    """A Redis or RabbitMQ broker, opened for one move."""

    #: The URL, password masked.
    display: str
    #: Whether a dry run can list the messages (RabbitMQ cannot read without taking).
    can_preview: bool
    #: The client library's errors (a lost connection mid-move).
    errors: tuple[type[BaseException], ...]

    def queues(self, wanted: Sequence[str]) -> list[str]: ...

    def blockers(self, queues: Sequence[str]) -> list[str]:
        """Live consumers (or another mover): each is a reason not to start."""
        ...

    def counts(self, queues: Sequence[str]) -> dict[str, SourceCounts]: ...

    def leftovers(self) -> list[Leftover]:
        """Messages found that no queue of this move can take (reported, left alone)."""
        ...

    def restore_unacked(self, queues: Sequence[str]) -> dict[str, int]:
        """Give dead workers' unacknowledged messages of ``queues`` back to the move."""
        ...

    def preview(self, queue: str) -> Iterator[SourceMessage]: ...

    def batches(self, queue: str, size: int) -> Iterator[Batch]: ...

    def settle(self, batch: Batch, keep: Sequence[int]) -> None:
        """Remove the batch's messages from the source, except those at ``keep``."""
        ...

    def finish(self, queue: str) -> None:
        """Put the messages kept during the queue's move back into it."""
        ...

    def close(self) -> None: ...
