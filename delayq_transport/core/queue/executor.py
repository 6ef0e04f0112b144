"""Where a publish's statements run: one interface, two connections.

:class:`~.offer.Offering` writes every offer through an :class:`Executor` and knows nothing
else of the connection: the compare-and-swap loop and the batch's outcomes are written once.
Two executors implement it:

* :class:`Pooled`, on a connection of delayq's own pool: the insert runs on libpq itself
  (core/db/direct.py), commits at once, and carries or hands on this process' wake-up
  (core/queue/announce.py); the compare-and-swap holds its row lock in a transaction of its own.
* :class:`InCaller`, on the caller's connection (core/queue/joined.py): the same named statements
  in their portable form, no commit, no announcer (it would commit or notify on delayq's
  connections): the insert notifies its own rows, delivered at the caller's commit and
  dropped with it or its savepoint. The row lock of a replace lasts until the caller's
  transaction ends (consumers skip locked rows); ``durable`` does not apply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from ..db.database import cursor_of
from ..db.rows import CreatedRow, named
from .announce import payloads

if TYPE_CHECKING:
    from ..db.database import Database
    from ..db.queries import Queries
    from .announce import Announcer
    from .joined import Joined

R = TypeVar("R")


class Executor(Protocol):
    """The connection a publish runs on, whoever owns it."""

    def run(self, statement: str, params: Mapping[str, Any]) -> Sequence[tuple[Any, ...]]:
        """The rows of the named statement (a block of the core's .sql files)."""

    def insert_one(self, params: dict[str, Any]) -> int | None:
        """``offer_insert`` with its wake-up: the row's ``scheduledAt``, or None when its key
        exists. Committed when the executor owns the transaction."""

    def insert_batch(self, params: dict[str, Any]) -> list[CreatedRow]:
        """``offer_batch_insert`` with its wake-up: the rows created. Committed likewise."""

    def locked(self) -> AbstractContextManager[Any]:
        """The transaction that holds a compare-and-swap's row lock."""


class Pooled:
    """A connection of delayq's pool, for the duration of one ``Database.run``."""

    __slots__ = ("conn", "queries", "announcer")

    def __init__(self, conn: psycopg.Connection[Any], queries: Queries,
                 announcer: Announcer) -> None:
        self.conn = conn
        self.queries = queries
        self.announcer = announcer

    def run(self, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return cursor_of(self.conn).execute(self.queries[statement], params).fetchall()

    def insert_one(self, params: dict[str, Any]) -> int | None:
        direct = self.queries.direct("offer_insert")  # the hot path: on libpq itself
        kind = params["kind"]
        at = self.announced(lambda wakeup: direct.first(self.conn, {**params, **wakeup}),
                            lambda at: () if at is None else ((kind, int(at)),))
        return None if at is None else int(at)

    def insert_batch(self, params: dict[str, Any]) -> list[CreatedRow]:
        return self.announced(
            lambda wakeup: named("offer_batch_insert",
                                 self.run("offer_batch_insert", {**params, **wakeup})),
            lambda rows: [(r.kind, r.scheduled_at) for r in rows])

    def locked(self) -> AbstractContextManager[Any]:
        return self.conn.transaction()

    def announced(self, send: Callable[[dict[str, Any]], R],
                  created: Callable[[R], Sequence[tuple[str, int]]]) -> R:
        """``send(wakeup)``: statements that insert rows, given ``wakeup`` (the ``announce``
        and ``pending`` parameters of the insert), then commit. The publish that opens the
        announcer's window carries the wake-up in its own statement; the others note the
        ``(kind, scheduledAt)`` of the rows ``created`` there after the commit. One that
        created no row gives back what it carried (nothing was notified either)."""
        carried = self.announcer.take()
        try:
            result = send({"announce": carried is not None, "pending": payloads(carried)})
            if self.conn.pgconn.transaction_status != TransactionStatus.IDLE:
                # Behind a transaction pooler every statement runs in a transaction that
                # Database opened: a failed commit is the caller's to see.
                self.conn.commit()
        except BaseException:
            if carried:
                self.announcer.restore(carried)
            raise
        rows = created(result)
        if carried is None:
            if rows:
                self.announcer.note(rows)
        elif carried and not rows:
            self.announcer.restore(carried)
        return result


#: The insert notifies the rows it creates, in the caller's transaction (nothing pending: this
#: process' announcer never carries over into a transaction that is not delayq's).
_ANNOUNCE: dict[str, Any] = {"announce": True, "pending": []}


class InCaller:
    """The caller's connection, inside its transaction (core/queue/joined.py): never a commit."""

    __slots__ = ("joined", "queries")

    def __init__(self, joined: Joined, queries: Queries, db: Database) -> None:
        joined.check_database(db)  # a row in another database would never reach a worker
        self.joined = joined
        self.queries = queries

    def run(self, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return self.joined.run(self.queries.portable(statement), params)

    def insert_one(self, params: dict[str, Any]) -> int | None:
        rows = self.run("offer_insert", {**params, **_ANNOUNCE})
        return int(rows[0][0]) if rows else None

    def insert_batch(self, params: dict[str, Any]) -> list[CreatedRow]:
        return named("offer_batch_insert",
                     self.run("offer_batch_insert", {**params, **_ANNOUNCE}))

    def locked(self) -> AbstractContextManager[Any]:
        return nullcontext()  # the caller's transaction holds the lock
