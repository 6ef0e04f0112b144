"""What the transport's parts need of each other, as Protocols, and the poll plan they pass.

The :class:`~.kombu_transport.Transport` owns its channels, the wake-ups, the maintenance thread
and the poller; they call back into it (wake a channel, arm the loop's timer, list the consuming
channels) and into the channels (flush acks, held locks, fetch a plan). Written against these
Protocols, none of them imports :mod:`.kombu_transport` or :mod:`.channel`, even for type
checking, so the package has no import circle, and what each part may call is its public API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..core.types import Envelope
from . import message as msg

if TYPE_CHECKING:
    from .backend import Backend


class ChannelPort(Protocol):
    """A channel, as the transport's parts see it (see :class:`~.channel.DelayqChannel`)."""

    poll_wanted: bool
    next_due_ms: int | None
    backlog: bool
    closed: bool

    def consumed_kinds(self) -> set[str]: ...

    def consumed_queues(self) -> set[str]: ...

    def flush_acks(self) -> None: ...

    def held_locks(self) -> set[str]: ...

    def fetch(self, plan: PollPlan) -> None: ...

    def deliver(self, plan: PollPlan) -> int: ...


class TransportPort(Protocol):
    """The transport, as its channels, wake-ups and maintenance see it."""

    options: dict[str, Any]
    polling_interval: float
    ack_flush_interval: float

    @property
    def backend(self) -> Backend: ...

    @property
    def lease_s(self) -> float: ...

    @property
    def hub(self) -> Any: ...

    def all_channels(self) -> Sequence[ChannelPort]: ...

    def consuming(self) -> Sequence[ChannelPort]: ...

    def wake(self, channel: ChannelPort | None = None) -> None: ...

    def schedule_hub_timer(self) -> None: ...

    def consuming_started(self, channel: ChannelPort) -> None: ...

    def ensure_maintenance(self) -> None: ...

    def channel_closed(self, channel: ChannelPort) -> None: ...

    def sleep(self, timeout: float) -> None: ...


@dataclass(slots=True)
class PollPlan:
    """One channel's share of a poll: made on the loop thread, filled in by the fetch."""

    channel: ChannelPort
    want: int
    kinds: list[str]
    no_ack: frozenset[str]
    next_due: int | None = None
    more: bool = False
    envelopes: list[Envelope] = field(default_factory=list)

    def needs_ack(self, env: Envelope) -> bool:
        return msg.queue_of_kind(env.kind)[0] not in self.no_ack

    def held(self) -> list[Envelope]:
        """Fetched rows still leased to us (no_ack ones are already deleted)."""
        return [e for e in self.envelopes if self.needs_ack(e)]
