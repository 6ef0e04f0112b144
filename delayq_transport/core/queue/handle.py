"""What the core's helper modules need of a queue, as a Protocol.

Counting, leases and the periodic statements take "a queue" (its pool, its statements, its
clock), and :class:`~.delayed_queue.DelayedQueue` uses some of them; written against this Protocol
rather than the class, they do not import :mod:`.delayed_queue`, even for type checking, so the core
has no import circle.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..db.database import Database
    from ..db.queries import Queries


class QueueHandle(Protocol):
    """A queue table (one kind of it) as statements see it."""

    db: Database
    queries: Queries
    table: str
    kind: str

    def clock_ms(self) -> int | None:
        """The injected clock's time in epoch ms, or None: SQL uses the database clock."""

    def now(self) -> datetime:
        """The queue's notion of now (the database clock unless injected)."""
