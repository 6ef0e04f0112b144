"""delayq: a PostgreSQL-backed delayed queue, with a kombu transport for Celery.

``DelayedQueue`` and ``CronService`` are the library core; ``delayq_transport.transport``
registers the ``delayq+postgresql://`` broker URL with kombu when imported.
"""

from __future__ import annotations

# ruff: noqa: E402
from kombu.transport import TRANSPORT_ALIASES

# The one step next to ``broker_url``: importing delayq teaches kombu the ``delayq+`` scheme.
TRANSPORT_ALIASES.setdefault("delayq", "delayq_transport.transport:Transport")

from .cron import CronHandle, CronMessage, CronService, DailySchedule, config_hash
from .db import Database, RetryPolicy
from .errors import (
    DatabaseError,
    DatabaseUnavailable,
    DelayqError,
    InvalidInput,
    SchemaMissing,
)
from .queue import DelayedQueue
from .schema import migrate
from .types import Envelope, KindStatus, Offer, OfferOutcome, StoredMessage

__all__ = [
    "CronHandle",
    "CronMessage",
    "CronService",
    "DailySchedule",
    "Database",
    "DatabaseError",
    "DatabaseUnavailable",
    "DelayedQueue",
    "DelayqError",
    "Envelope",
    "InvalidInput",
    "KindStatus",
    "Offer",
    "OfferOutcome",
    "RetryPolicy",
    "SchemaMissing",
    "StoredMessage",
    "config_hash",
    "migrate",
]
__version__ = "0.1.0"
