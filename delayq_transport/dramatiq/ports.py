"""What the consumers and their hub need of the broker, as Protocols, so :mod:`.consumer` does
not import :mod:`.broker`, which imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from dramatiq.broker import MessageProxy

if TYPE_CHECKING:
    from ..core.db import Database
    from ..core.queue import DelayedQueue


class HubPort(Protocol):
    """The broker's background thread, as its consumers see it."""

    def register(self, consumer: Any) -> None: ...

    def unregister(self, consumer: Any) -> None: ...


class BrokerPort(Protocol):
    """:class:`~.broker.DelayqBroker` as its consumers and hub see it."""

    db: Database
    queue: DelayedQueue
    polling_interval: float
    unheard_polling_interval: float
    lease_s: float
    dead_message_ttl_s: float

    @property
    def hub(self) -> HubPort: ...

    def kinds_for(self, queue_name: str) -> list[str]:
        """Every kind of a queue, highest priority first."""

    def dead_letter_kind(self, queue_name: str) -> str:
        """Where the queue's failed messages go."""

    def record_failure(self, queue_name: str, message: MessageProxy,
                       exc: BaseException | None) -> None:
        """Remember a dead-lettered message's exception (``join(fail_fast=True)``)."""

    def expire_dead_letters(self) -> int:
        """Delete dead letters past their retention; returns how many."""
