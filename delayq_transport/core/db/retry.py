"""Which database failures are worth another attempt, how long to wait between attempts, and
what a failure that is not becomes: the parts of the database boundary (core/db/database.py) that
need no connection, kept apart so db.py holds the pool and its retry loop only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from .errors import (
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    PermissionDenied,
    SchemaMissing,
)
from .timeouts import timeout_error
from .urls import mask_password

#: Errors after which running the same statement again can succeed.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
    pg_errors.LockNotAvailable,
    pg_errors.AdminShutdown,
    pg_errors.CannotConnectNow,
    psycopg.OperationalError,
    PoolTimeout,
)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for transient failures."""

    attempts: int = 6
    initial_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def delays(self) -> Iterator[float]:
        """The waits between attempts, jittered."""
        delay = self.initial_delay_s
        for _ in range(self.attempts - 1):
            yield delay * (0.5 + random.random() / 2)
            delay = min(delay * 2, self.max_delay_s)


def translate(exc: BaseException, url: str) -> Exception:
    """Map a driver error to a delayq error whose message says what to do."""
    where = mask_password(url)
    if (limit := timeout_error(exc, where)) is not None:  # before OperationalError: a subclass
        return limit
    if isinstance(exc, pg_errors.UndefinedTable):
        return SchemaMissing(f"{exc.diag.message_primary} (run `delayq migrate` against {where})")
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return PermissionDenied(f"permission denied on {where}: {exc.diag.message_primary}")
    if isinstance(exc, pg_errors.StringDataRightTruncation | pg_errors.ProgramLimitExceeded):
        return InvalidInput(f"value too large for the queue table: {exc.diag.message_primary}")
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return DatabaseUnavailable(f"database {where} unreachable: {str(exc).strip()}")
    return DatabaseError(f"database error on {where}: {str(exc).strip()}")
