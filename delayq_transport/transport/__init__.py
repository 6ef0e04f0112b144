"""The kombu transport: Celery's ``delayq+postgresql://`` broker on the queue core.

``delayq_transport.transport:Transport`` is the class kombu loads for the ``delayq`` alias
(see :mod:`.kombu_transport` for its features, connection string and options); :mod:`.message`
encodes Celery's messages into rows and back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .kombu_transport import DelayqChannel, Transport

__all__ = ["DelayqChannel", "Transport"]


def __getattr__(name: str) -> Any:
    """Import the transport class on first use (PEP 562): code that only needs the row
    encoding (:mod:`.message`: ``delayq status``, Spark, beat) does not load kombu's virtual
    transport machinery."""
    if name in __all__:
        from . import kombu_transport

        return getattr(kombu_transport, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
