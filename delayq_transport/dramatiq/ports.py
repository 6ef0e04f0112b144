"""What the consumers need of the broker, as a Protocol, so :mod:`.consumer` does not import
:mod:`.broker`, which imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from dramatiq.broker import MessageProxy

if TYPE_CHECKING:
    from ..core.queue import DelayedQueue, Session


class BrokerPort(Protocol):
    """:class:`~.broker.DelayqBroker` as its consumers see it."""

    queue: DelayedQueue
    dead_message_ttl_s: float

    @property
    def session(self) -> Session: ...

    def kinds_for(self, queue_name: str) -> list[str]:
        """Every kind of a queue, highest priority first."""

    def dead_letter_kind(self, queue_name: str) -> str:
        """Where the queue's failed messages go."""

    def record_failure(self, queue_name: str, message: MessageProxy,
                       exc: BaseException | None) -> None:
        """Remember a dead-lettered message's exception (``join(fail_fast=True)``)."""
