"""Publishing in the caller's transaction: the one place delayq runs a statement on a connection
it does not own.

River's ``InsertTx`` and Oban's insert inside ``Repo.transaction`` give what an application
wants from a queue in its own database: a task written in the application's transaction is
invisible until that transaction commits and gone if it rolls back. Here the statements stay
the core's named blocks (``offer_insert``, ``offer_batch_insert``); what
changes is whose connection runs them. :func:`transaction` names that connection for the code
inside it, so unchanged publishing code (Celery's ``apply_async``, Dramatiq's ``send``, the
core's ``offer``) writes there; :func:`current` is what the publishing code asks.

What is accepted as "a connection in a transaction": a psycopg 3 or psycopg2 connection, a
SQLAlchemy 2 ``Connection`` (in a transaction) or ``Session`` (its connection), or a Django
database connection (PostgreSQL backend, either driver). None of those frameworks is imported:
they are recognised by their type's module and unwrapped to the driver's connection.

What delayq does on that connection, and what it never does:

* one statement per publish, the insert carrying its NOTIFY (``Queries.portable``):
  ``%(name)s`` placeholders filled in by the driver on the client (psycopg 3's
  ``ClientCursor``, psycopg2's cursor), so psycopg2 and psycopg 3 send the same text, nothing
  is prepared (a transaction pooler lends another server session next time), and the NOTIFY
  is delivered at the caller's commit, when the rows become visible;
* never a commit, a rollback, a ``SET``, an isolation level or a savepoint of its own; a
  connection in autocommit outside a transaction block, an aborted transaction and a closed
  connection are refused, since a publish there would commit on its own or fail;
* no connection of delayq's pool: the row, its wake-up and the routing lookup go through the
  caller's connection; the one exception is a database whose identity disagrees with the one
  read when delayq connected (a failover, a restart), read again once before refusing.

The same database: a task row written in another database than the broker's would never reach
a worker, and one written through delayq's own connection would not share the commit, so a
transaction on another database is refused, naming both (:meth:`Joined.check_database`). Both
sides are identified by what the server reports (``database_identity``): the database name,
the cluster's system identifier and its start time. Host names cannot do it: one server
answers to several names, sockets and ports, and a PgBouncer stands in front of it. The
caller's side is read once per connection (one statement, in its transaction) and kept.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import psycopg

from ..db.errors import (
    DatabaseError,
    DelayqError,
    InvalidInput,
    PermissionDenied,
    SchemaMissing,
    TransactionRefused,
)
from ..db.queries import raw_queries
from ..db.urls import mask_password

if TYPE_CHECKING:
    from ..db.database import Database

#: Transaction status codes, the same numbers in psycopg 3 (``pq.TransactionStatus``) and
#: psycopg2 (``extensions.TRANSACTION_STATUS_*``).
_IDLE, _ACTIVE, _INTRANS, _INERROR = 0, 1, 2, 3

_CURRENT: ContextVar[Joined | None] = ContextVar("delayq_transaction", default=None)
#: A framework's notion of "the current transaction" (the Django app's ``atomic()`` blocks),
#: asked when no :func:`transaction` block is open; None: nothing to ask.
_implicit: Callable[[], Joined | None] | None = None
#: Inside :func:`detached`: the framework's transaction is not asked.
_DETACHED: ContextVar[bool] = ContextVar("delayq_detached", default=False)


def current() -> Joined | None:
    """The caller's transaction a publish made now joins, or None (delayq's own connection)."""
    joined = _CURRENT.get()
    if joined is None and _implicit is not None and not _DETACHED.get():
        return _implicit()
    return joined


@contextmanager
def detached() -> Iterator[None]:
    """Publish on delayq's own connection inside this block (committed at once), even inside a
    framework's transaction that :func:`set_implicit` would join (the Django task backend's
    ``JOIN_ATOMIC = False`` beside ``DELAYQ_JOIN_ATOMIC``); a :func:`transaction` block opened
    inside it still joins."""
    token = _DETACHED.set(True)
    try:
        yield
    finally:
        _DETACHED.reset(token)


def set_implicit(provider: Callable[[], Joined | None] | None) -> None:
    """Install (None: remove) the framework hook :func:`current` asks outside any block."""
    global _implicit
    _implicit = provider


@contextmanager
def transaction(connection: Any) -> Iterator[Joined]:
    """Publish through ``connection`` inside this block: every task published in it is written
    in the connection's transaction, so it is seen by workers once that transaction commits and
    never if it rolls back. ``connection``: a psycopg 3 or psycopg2 connection, a SQLAlchemy 2
    ``Connection`` or ``Session``, or a Django database connection (PostgreSQL, either driver),
    on the broker's database; delayq never commits or rolls it back."""
    joined = Joined(connection)
    token = _CURRENT.set(joined)
    try:
        yield joined
    finally:
        _CURRENT.reset(token)


class _ConnState:
    """What delayq keeps about one caller connection: its database identity and the
    Databases it was found to share. Nothing in it refers to the connection, which is the
    weak key: a connection the caller drops is not kept alive by delayq."""

    __slots__ = ("identity", "verified", "__weakref__")

    def __init__(self) -> None:
        self.identity: tuple[str, ...] | None = None
        self.verified: weakref.WeakSet[Database] = weakref.WeakSet()


_STATES: weakref.WeakKeyDictionary[Any, _ConnState] = weakref.WeakKeyDictionary()


class Joined:
    """A caller's driver connection, on which the core runs its statements (never commits)."""

    __slots__ = ("raw", "hint", "_resolve", "_psycopg3", "_state")

    def __init__(self, connection: Any, hint: str = "") -> None:
        #: What the framework that joined the transaction calls the setting to change when it
        #: is on another database than the broker's (the Django app names DELAYQ_DATABASE).
        self.hint = hint
        self._resolve = resolver(connection)
        self.raw: Any = None
        self._bind()

    def _bind(self) -> None:
        """Look the driver connection up again: a SQLAlchemy Session emits a pending
        ``begin_nested()`` SAVEPOINT only when its connection is asked for, and may hold
        another connection after a commit; Django may have reconnected."""
        raw = self._resolve()
        if raw is self.raw:
            return
        self.raw = raw
        self._psycopg3 = isinstance(raw, psycopg.Connection)
        state = _STATES.get(raw)
        if state is None:
            state = _STATES[raw] = _ConnState()
        self._state = state

    def run(self, text: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Send ``text`` (one or more statements) in one round trip; the last one's rows."""
        self._bind()
        self._check_transaction()
        try:
            if self._psycopg3:
                return self._run_psycopg3(text, params)
            return self._run_psycopg2(text, params)
        except Exception as exc:
            if type(exc).__module__.startswith(("psycopg.", "psycopg2")):
                raise self._translate(exc) from exc
            raise

    def _run_psycopg3(self, text: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        # A client-side-binding cursor kept on the connection (a cycle the collector frees
        # with it), as core/db/direct.py keeps its state.
        cur: psycopg.ClientCursor[Any] | None = getattr(self.raw, "_delayq_client_cursor", None)
        if cur is None or cur.closed:
            cur = self.raw._delayq_client_cursor = psycopg.ClientCursor(self.raw)
        cur.execute(text, params)
        while cur.nextset():
            pass
        return cur.fetchall() if cur.description is not None else []

    def _run_psycopg2(self, text: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with self.raw.cursor() as cur:
            cur.execute(text, params)
            rows = cur.fetchall() if cur.description is not None else []
        # psycopg2 returns bytea as memoryview; the core compares and hands out bytes.
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in rows]

    def _status(self) -> int:
        if self._psycopg3:
            return int(self.raw.pgconn.transaction_status)
        return int(self.raw.get_transaction_status())

    def _check_transaction(self) -> None:
        """Refuse what would not be "in the caller's transaction": a statement on a connection
        in autocommit outside a transaction block commits on its own."""
        if self.raw.closed:
            raise TransactionRefused(f"the connection of your transaction ({self.where()}) is "
                                     "closed: nothing was published")
        status = self._status()
        if status == _INERROR:
            raise TransactionRefused(
                f"your transaction on {self.where()} is aborted (an earlier statement in it "
                "failed): roll it back before publishing; nothing was published")
        if status == _IDLE and self.raw.autocommit:
            raise TransactionRefused(
                f"the connection {self.where()} is in autocommit mode outside a transaction "
                "block, so a task published on it would commit on its own: open a transaction "
                "first (psycopg: `with conn.transaction():`, Django: `transaction.atomic()`, "
                "SQLAlchemy: `conn.begin()`); nothing was published")
        if status not in (_IDLE, _INTRANS):
            raise TransactionRefused(f"the connection {self.where()} is busy with another "
                                     "statement; nothing was published")

    def check_database(self, db: Database) -> None:
        """Refuse a transaction on another database than ``db`` (see the module docstring)."""
        self._bind()
        state = self._state
        if db in state.verified:
            return
        if state.identity is None:
            rows = self.run(raw_queries()["database_identity"], {})
            state.identity = tuple(str(v) for v in rows[0])
        theirs = db.identity
        if state.identity != theirs:
            theirs = db.refresh_identity()  # a failover or restart since delayq connected?
        if state.identity != theirs:
            raise TransactionRefused(
                f"your transaction is on database {_describe(state.identity)} through "
                f"{self.where()}, and the broker is database {_describe(theirs)} at "
                f"{mask_password(db.url)}: a task written in your transaction would never "
                "reach the broker's workers, and one written by the broker would not commit "
                "or roll back with your data. Publish it outside the transaction, or keep the "
                "broker's table in your application's database"
                + (f" ({self.hint})" if self.hint else "") + "; nothing was published")
        state.verified.add(db)

    def where(self) -> str:
        """The caller's connection as libpq sees it (no password)."""
        try:
            info = self.raw.info
            return f"host {info.host} port {info.port} database {info.dbname!r}"
        except Exception:  # a closed psycopg2 connection has no info left
            return "a closed connection"

    def _translate(self, exc: Exception) -> DelayqError:
        code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        text = str(exc).strip()
        if code == "42P01":
            return SchemaMissing(f"{text} (run `delayq migrate` against the database of "
                                 f"your transaction, {self.where()})")
        if code == "42501":
            return PermissionDenied(f"permission denied in your transaction on "
                                    f"{self.where()}: {text}")
        return DatabaseError(f"publishing in your transaction on {self.where()} failed "
                             f"(the transaction is now aborted): {text}")


def _describe(identity: tuple[str, ...]) -> str:
    if len(identity) != 3:
        return "(unknown)"
    name, system, started = identity
    return f"{name!r} (cluster {system}, up since {started})"


def resolver(obj: Any) -> Callable[[], Any]:
    """How to reach the psycopg 3 or psycopg2 connection behind ``obj`` at each statement
    (see the module docstring for what ``obj`` may be)."""
    if isinstance(obj, psycopg.AsyncConnection):
        raise InvalidInput("delayq publishes synchronously: pass a psycopg.Connection, not an "
                           "AsyncConnection")
    if _is_driver(obj):
        return lambda: obj
    module = type(obj).__module__
    if module.startswith("sqlalchemy."):
        return lambda: _from_sqlalchemy(obj)
    if module.startswith("django."):
        if getattr(obj, "vendor", None) != "postgresql":
            raise InvalidInput(f"the Django database {getattr(obj, 'alias', '?')!r} is not "
                               "PostgreSQL: delayq joins PostgreSQL transactions only")
        return lambda: _from_django(obj)
    raise InvalidInput(
        f"cannot publish in a transaction of {type(obj).__module__}.{type(obj).__name__}: "
        "pass a psycopg 3 or psycopg2 connection, a SQLAlchemy Connection or Session, or a "
        "Django database connection")


def _is_driver(obj: Any) -> bool:
    if isinstance(obj, psycopg.Connection):
        return True
    extensions = sys.modules.get("psycopg2.extensions")
    return extensions is not None and isinstance(obj, extensions.connection)


def _only_driver(raw: Any, what: str) -> Any:
    if not _is_driver(raw):
        raise InvalidInput(f"{what} runs on {type(raw).__module__}.{type(raw).__name__}; "
                           "delayq joins transactions of psycopg 3 and psycopg2 only")
    return raw


def _from_sqlalchemy(obj: Any) -> Any:
    """A Session (or scoped_session) gives its connection, which begins its transaction. A
    Connection between transactions begins one as its next statement would (SQLAlchemy 2's
    autobegin): a statement sent past it would open a transaction SQLAlchemy does not know
    of, which ``conn.commit()`` would then not commit."""
    if callable(getattr(obj, "connection", None)) and hasattr(obj, "get_bind"):
        obj = obj.connection()
    if not obj.in_transaction():
        obj.begin()
    return _only_driver(obj.connection.dbapi_connection, "this SQLAlchemy engine")


def _from_django(obj: Any) -> Any:
    obj.ensure_connection()
    return _only_driver(obj.connection, f"the Django database {obj.alias!r}")
