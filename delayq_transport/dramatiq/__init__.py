"""Dramatiq on delayq: a broker whose delays wait in PostgreSQL, and periodic actors.

    from delayq_transport.dramatiq import DelayqBroker
    dramatiq.set_broker(DelayqBroker(url="postgresql://user@host/db"))

See docs/how-to/dramatiq.md. ``decode_dramatiq`` and the names of :mod:`..formats.dramatiq`
import without Dramatiq installed; the broker and the periodic API need
``pip install delayq[dramatiq]``.
"""

from __future__ import annotations

from typing import Any

from ..formats.dramatiq import decode_dramatiq

__all__ = ["DelayqBroker", "PeriodicScheduler", "decode_dramatiq", "periodic"]


def __getattr__(name: str) -> Any:
    """Import the Dramatiq-dependent parts on first use (the CLI lists rows without them)."""
    if name == "DelayqBroker":
        from .broker import DelayqBroker

        return DelayqBroker
    if name in ("periodic", "PeriodicScheduler"):
        from . import periodic as module

        return getattr(module, name)
    raise AttributeError(name)
