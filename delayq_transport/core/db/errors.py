"""delayq's own exceptions.

Driver errors are translated at the database boundary (:mod:`delayq_transport.core.db`), so callers
(the kombu transport, beat, Spark) never need to import psycopg to handle a failure.
"""

from __future__ import annotations


class DelayqError(Exception):
    """Base class of every error delayq raises on purpose."""


class InvalidInput(DelayqError, ValueError):
    """A value was rejected before anything was sent to the database."""


class DatabaseUnavailable(DelayqError, ConnectionError):
    """The database could not be reached, or stayed unreachable through every retry."""


class ListenUndeliverable(DatabaseUnavailable):
    """LISTEN cannot deliver notifications on this connection (a transaction pooler such as
    PgBouncer lends the session to other clients between transactions). Not transient: the
    consumer polls instead, or LISTENs through a direct ``listen_url``. ``expected``: known
    before trying (a detected pooler), so worth a log line at INFO rather than a warning."""

    def __init__(self, message: str, *, expected: bool = False) -> None:
        super().__init__(message)
        self.expected = expected


class DatabaseError(DelayqError):
    """The database refused an operation for a reason retrying will not fix."""


class TransactionRefused(DatabaseError):
    """A publish could not join the caller's transaction (core/queue/joined.py): another database
    than the broker's, no transaction open, an aborted one. Nothing was published; never
    retried, since the same transaction would be refused again."""


class SchemaMissing(DatabaseError):
    """The queue table does not exist and schema creation was turned off."""


class PermissionDenied(DatabaseError):
    """The role lacks a privilege the operation needs (see ``delayq grants``)."""


class RunMismatch(InvalidInput):
    """A part of a run recorded as applied holds other records now (core/ledgers/runs.py): the
    input, or how it is split into parts, changed since. Skipping the part could lose rows and
    writing it could run tasks twice, so nothing of it was written."""


class ServerTimeout(DatabaseUnavailable):
    """A limit set on the server (``statement_timeout``, ``lock_timeout``,
    ``idle_in_transaction_session_timeout``) cancelled the statement; the message names it.

    A kind of unavailability rather than a refusal: the same statement may pass a moment
    later (a busy table, a slow disk), so workers reconnect and go on instead of stopping
    (a Celery worker stops on any other DatabaseError raised in its event loop)."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        #: The server setting that cancelled the statement.
        self.setting = setting
