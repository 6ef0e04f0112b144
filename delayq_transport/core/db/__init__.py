"""The database boundary, the bottom of the core: everything else stands on it.

The psycopg 3 pool with bounded retries and error translation (:mod:`.database`,
:mod:`.retry`, :mod:`.timeouts`), database URLs as users write them (:mod:`.urls`), delayq's
exceptions (:mod:`.errors`), and the one loader of the core's SQL (:mod:`.queries`: the named
blocks of every part's ``.sql`` file, bound to one table; :mod:`.direct` and :mod:`.rows` run
the hottest of them on libpq and name their rows). Its own statements (``db.sql``) mark a
session and name the database a pool reaches. It imports no other part.

Adapters use the names of ``__all__`` (most through :mod:`delayq_transport.core`); the
statements themselves (``Queries``) are the core's alone.
"""

from __future__ import annotations

from .database import Database
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
from .queries import validate_table_name
from .retry import RetryPolicy
from .urls import FAILOVER_SEPARATOR, mask_password, normalize_url, params_url, with_param

__all__ = [
    "FAILOVER_SEPARATOR",
    "Database",
    "DatabaseError",
    "DatabaseUnavailable",
    "DelayqError",
    "InvalidInput",
    "ListenUndeliverable",
    "PermissionDenied",
    "RetryPolicy",
    "RunMismatch",
    "SchemaMissing",
    "ServerTimeout",
    "TransactionRefused",
    "mask_password",
    "normalize_url",
    "params_url",
    "validate_table_name",
    "with_param",
]
