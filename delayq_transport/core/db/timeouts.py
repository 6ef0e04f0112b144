"""The limits a DBA or a managed service puts on a role or database, named when they bite.

``statement_timeout``, ``lock_timeout`` and ``idle_in_transaction_session_timeout`` are often
set per role (``ALTER ROLE app SET statement_timeout = '30s'``) where delayq cannot see them.
PostgreSQL's own message ("canceling statement due to statement timeout") does not say which
setting to change or where, and psycopg raises it as an ``OperationalError``, which delayq
reported as "database unreachable". :func:`timeout_error` turns each into a
:class:`~.errors.ServerTimeout` naming the setting and what to do.
"""

from __future__ import annotations

from psycopg import errors as pg_errors

from .errors import ServerTimeout

#: Cancellations by each limit, and what to tell the operator.
_ADVICE = {
    "statement_timeout": "raise it where it is set (the role's or the database's "
                         "settings), or for this one run (PGOPTIONS='-c "
                         "statement_timeout=10min'); delayq's runtime statements take "
                         "milliseconds, bulk loads and --exact counts longer",
    "lock_timeout": "another session held a lock this statement needed for longer; retry when "
                    "the table is quieter, or raise lock_timeout for the role that runs it "
                    "(PGOPTIONS='-c lock_timeout=10s' delayq migrate)",
    "idle_in_transaction_session_timeout": "the server ended a session left idle inside a "
                                           "transaction; raise the setting for this role",
}


def timeout_error(exc: BaseException, where: str) -> ServerTimeout | None:
    """The :class:`ServerTimeout` for a cancellation by a server-side limit, else None (a
    cancellation by ``pg_cancel_backend`` is not a limit and is left alone)."""
    setting = None
    if isinstance(exc, pg_errors.QueryCanceled) and "statement timeout" in str(exc):
        setting = "statement_timeout"
    elif isinstance(exc, pg_errors.LockNotAvailable) and "lock timeout" in str(exc):
        setting = "lock_timeout"
    elif isinstance(exc, pg_errors.IdleInTransactionSessionTimeout):
        setting = "idle_in_transaction_session_timeout"
    if setting is None:
        return None
    reason = str(exc).strip().splitlines()[0]
    return ServerTimeout(f"{setting} cancelled a statement on {where} ({reason}): "
                         f"{_ADVICE[setting]}", setting)
