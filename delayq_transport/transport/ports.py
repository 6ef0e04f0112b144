"""The transport as its channels see it, as a Protocol: :mod:`.channel` does not import
:mod:`.kombu_transport` (which imports it), even for type checking, so the package has no import
circle, and what a channel may call is the transport's public API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..core.queue import Session
    from .backend import Backend


class TransportPort(Protocol):
    """The transport, as its channels see it (see :class:`~.transport.Transport`)."""

    @property
    def backend(self) -> Backend: ...

    @property
    def session(self) -> Session: ...

    def consuming_started(self) -> None: ...
