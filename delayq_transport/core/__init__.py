"""The queue core: ``DelayedQueue`` and ``CronService`` on PostgreSQL.

Everything that talks to the database lives here: the driver boundary (:mod:`.db`), the schema
and its numbered migrations (:mod:`.schema`), and every SQL statement delayq sends, named after
its operation in ``queries.sql`` (loaded by :mod:`.queries`). The core imports no adapter
(kombu transport, Spark, CLI, beat); adapters call this API and never build SQL.
"""

from __future__ import annotations

from .cron import CronHandle, CronMessage, CronService, DailySchedule, config_hash
from .db import Database, RetryPolicy
from .errors import (
    DatabaseError,
    DatabaseUnavailable,
    DelayqError,
    InvalidInput,
    ListenUndeliverable,
    PermissionDenied,
    RunMismatch,
    SchemaMissing,
    ServerTimeout,
    TransactionRefused,
)
from .joined import detached, transaction
from .listen import Listener
from .publish_buffer import PublishBuffer
from .queries import validate_table_name
from .queue import DelayedQueue
from .schema import migrate, require_schema
from .session import Session, Subscription
from .task_results import StoredResult, TaskResults
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
    "ListenUndeliverable",
    "Listener",
    "Offer",
    "OfferOutcome",
    "PermissionDenied",
    "PublishBuffer",
    "RetryPolicy",
    "RunMismatch",
    "SchemaMissing",
    "ServerTimeout",
    "Session",
    "StoredMessage",
    "StoredResult",
    "Subscription",
    "TaskResults",
    "TransactionRefused",
    "config_hash",
    "detached",
    "migrate",
    "require_schema",
    "transaction",
    "validate_table_name",
]
