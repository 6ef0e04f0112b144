"""One connection pool per process instead of two, for a tight connection budget.

A :class:`~.db.Database` keeps two pools: statements whose commit waits for the WAL flush,
and relaxed ones (publishes with ``durable=False``, polls, acks, lease extensions,
releases) on sessions that commit without waiting and carry the hot path's plan settings
(see :attr:`~.db.Database.relaxed_pool`). Each pool holds a connection once used, so every
process that publishes holds two and a consuming one three with its LISTEN: a Celery worker
with 10 pool children whose tasks publish held 25-45 connections (issue 26).

:class:`SinglePoolDatabase` runs the relaxed statements on the one pool instead, inside a
transaction that opens with the same settings as ``SET LOCAL`` (``BEGIN`` and the settings
in one round trip, the ``COMMIT`` in another): a publishing process then holds one connection.
It costs those two round trips per relaxed operation; measured in ``docs/operations.md``
(*Deploying*, connection sizing). Chosen with the transport option ``single_pool``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import ConnStatus, ExecStatus
from psycopg_pool import ConnectionPool

from .db import Database
from .queries import raw_queries

T = TypeVar("T")


class SinglePoolDatabase(Database):
    """A Database whose relaxed statements share the one pool (see the module docstring)."""

    @property
    def relaxed_pool(self) -> ConnectionPool:
        return self.pool

    def run(self, work: Callable[[psycopg.Connection[Any]], T], *, idempotent: bool = True,
            relaxed: bool = False) -> T:
        if not relaxed:
            return super().run(work, idempotent=idempotent)

        def in_relaxed_transaction(conn: psycopg.Connection[Any]) -> T:
            # ``work``'s own conn.transaction() becomes a savepoint; Database.run commits.
            _begin_relaxed(conn)
            return work(conn)

        return super().run(in_relaxed_transaction, idempotent=idempotent)


@cache
def _begin_relaxed_sql() -> bytes:
    return raw_queries()["relaxed_begin"].encode()


def _begin_relaxed(conn: psycopg.Connection[Any]) -> None:
    """``BEGIN`` and the relaxed settings through libpq's simple protocol: several statements
    in one round trip, nothing prepared (a transaction pooler lends another session next)."""
    result = conn.pgconn.exec_(_begin_relaxed_sql())
    if result.status != ExecStatus.COMMAND_OK:
        if conn.pgconn.status == ConnStatus.BAD:
            raise psycopg.OperationalError("connection lost: " + conn.pgconn.error_message
                                           .decode(errors="replace").strip())
        raise pg_errors.error_from_result(result, encoding=conn.info.encoding)
