"""The queue core: ``DelayedQueue`` and ``CronService`` on PostgreSQL.

Everything that talks to the database lives here, in parts that stand on one another, from
the bottom (the folders of this package; each one's ``__init__`` says what it holds):

* :mod:`.db`: the database boundary: the pool, retries, errors, URLs, and the one loader of
  the SQL.
* :mod:`.schema`: the declared schema and its numbered migrations, grants, uninstall.
* :mod:`.queue`: the queue and its hot path: publish, poll, leases, acks, wake-ups, the one
  consumer session under every front end.
* :mod:`.inspect`: reading a table as an operator does: listings, search, counts, health, scans.
* :mod:`.ledgers`: what was done once: the run ledger, ``delayq demo``'s run log.
* :mod:`.integrations`: each integration's tables: the scheduling engine's (and
  ``CronService``), django-celery-beat's, kombu's exchange bindings, Spark's bulk writes.

A part imports only the parts above it in this list. Every statement is a named block of the
``.sql`` file of the part that runs it. The core imports no adapter (kombu transport, Spark,
CLI, beat); adapters call the names this package and each part's ``__all__`` publish, never a
module inside a part, and never build SQL (tests/unit/test_layout.py).
"""

from __future__ import annotations

from .db import (
    Database,
    DatabaseError,
    DatabaseUnavailable,
    DelayqError,
    InvalidInput,
    ListenUndeliverable,
    PermissionDenied,
    RetryPolicy,
    RunMismatch,
    SchemaMissing,
    ServerTimeout,
    TransactionRefused,
    validate_table_name,
)
from .integrations import CronHandle, CronMessage, CronService, DailySchedule, config_hash
from .ledgers import LostAttempt, StoredResult, TaskResults
from .queue import (
    DelayedQueue,
    Envelope,
    KindStatus,
    Listener,
    Offer,
    OfferOutcome,
    PublishBuffer,
    Session,
    StoredMessage,
    Subscription,
    detached,
    transaction,
)
from .schema import migrate, require_schema

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
    "LostAttempt",
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
