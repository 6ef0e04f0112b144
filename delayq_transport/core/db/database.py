"""The whole database boundary: a psycopg 3 pool, bounded retries and error translation.

Queue logic above this module never sees a psycopg exception: transient failures
(serialization failures, deadlocks, lost connections) are retried with bounded exponential
backoff, everything else becomes a :mod:`delayq_transport.core.db.errors` exception naming the
problem.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ConnStatus, ExecStatus, TransactionStatus
from psycopg_pool import ConnectionPool

from .errors import InvalidInput
from .queries import raw_queries
from .retry import TRANSIENT_ERRORS, RetryPolicy, translate  # re-exported (core, bulk)
from .urls import mask_password, normalize_url  # re-exported: every URL form

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Session settings of every pooled delayq connection. ``jit=off``: each hot statement reads a
#: handful of rows through an index, but its cost is estimated from table size; on a table of
#: millions of rows (and under generic plans) that estimate crossed ``jit_above_cost`` and every
#: execution spent 34-71 ms compiling code for a 0.8 ms statement (issue 10). delayq never runs a
#: statement that JIT could speed up, so it is off for its own sessions only, not the database.
SESSION_SETTINGS: dict[str, str] = {"jit": "off"}

#: Settings of the relaxed pool (see :attr:`Database.relaxed_pool` for why each).
RELAXED_SETTINGS: dict[str, str] = {
    "synchronous_commit": "off", "plan_cache_mode": "force_generic_plan",
    "enable_seqscan": "off", "enable_bitmapscan": "off", "enable_sort": "off"}

#: A custom setting sent with the others at connect time and read back once: when it is not
#: there, something between delayq and PostgreSQL (PgBouncer with
#: ``ignore_startup_parameters = options``) dropped the startup options, so session state cannot
#: be relied on either.
_MARKER = "delayq.session"
#: What a probe learnt, by (URL, detect): whether startup options hold, and the database's
#: identity, with the pid of the process that probed. Read only in a process forked from that
#: one (a prefork pool child): see Database._probe.
_PROBED: dict[tuple[str, bool], tuple[int, bool, tuple[str, ...]]] = {}

#: What ``pooling=`` accepts: ``auto`` detects a pooler, ``session`` is a real session (or a
#: session-pooling PgBouncer), ``transaction`` assumes nothing survives a transaction.
POOLING_MODES = ("auto", "session", "transaction")

class Database:
    """A connection pool plus the retry loop every operation runs through."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        pooling: str = "auto",
        listen_url: str | None = None,
        single_pool: bool = False,
    ) -> None:
        """``single_pool``: relaxed statements (see :attr:`relaxed_pool`) run on the one pool
        instead of a second one, each in a transaction opened with the relaxed settings as
        ``SET LOCAL``: a publishing process then holds one connection, for a tight connection
        budget (two round trips more per relaxed operation; docs/how-to/managed-service.md).
        ``pooling`` and ``listen_url``: see :meth:`_probe` and docs/how-to/pgbouncer.md."""
        self.url = normalize_url(url)
        #: Where LISTEN connects: a direct URL past a transaction pooler restores push wake-ups.
        self.listen_url = normalize_url(listen_url) if listen_url else self.url
        self.retry = retry or RetryPolicy()
        self.connect_timeout_s = connect_timeout_s
        if pooling not in POOLING_MODES:
            raise InvalidInput(f"pooling must be one of {', '.join(POOLING_MODES)}, "
                               f"got {pooling!r}")
        #: True when no session state may be assumed to outlive a transaction (PgBouncer's
        #: transaction pooling): no named prepared statements, settings applied per transaction
        #: with SET LOCAL, LISTEN checked for delivery. See :meth:`_probe`.
        self.transaction_pooling = pooling == "transaction"
        #: Whether the server takes session settings as startup options.
        self._options_ok = True
        #: Which database this is (core/queue/joined.py compares it with a caller's connection).
        self.identity: tuple[str, ...] = ()
        self._probe(detect=pooling == "auto")
        pooled = self.transaction_pooling
        #: How a transaction opens where settings cannot ride on the connection (None: it
        #: does not open one, autocommit): behind a transaction pooler every transaction
        #: carries its pool's settings; on the one pool of ``single_pool`` a relaxed one
        #: carries the relaxed settings. BEGIN and SET LOCAL go in one round trip.
        self._begin = b"BEGIN; " + set_statement(SESSION_SETTINGS, local=True) if pooled \
            else None
        self._relaxed_begin = b"BEGIN; " + set_statement(
            {**(SESSION_SETTINGS if pooled else {}), **RELAXED_SETTINGS}, local=True) \
            if pooled or single_pool else None
        self._sizes = (min_size, max(max_size, min_size))
        self.pool = self._make_pool("delayq")
        self._relaxed_pool: ConnectionPool | None = self.pool if single_pool else None
        self._closed = False
        self._lock = threading.Lock()

    def _make_pool(self, name: str, **settings: str) -> ConnectionPool:
        kwargs = self._connect_kwargs({**SESSION_SETTINGS, **settings})
        if "application_name" not in conninfo_to_dict(self.url):
            kwargs["application_name"] = name  # tells the two pools apart in pg_stat_activity
        configure = None
        if self.transaction_pooling:

            def configure(conn: psycopg.Connection[Any]) -> None:
                conn._delayq_unprepared = True  # type: ignore[attr-defined]  # core/db/direct.py
        elif not self._options_ok:  # a session pooler that drops startup options: SET once
            setup = set_statement({**SESSION_SETTINGS, **settings}, local=False)

            def configure(conn: psycopg.Connection[Any]) -> None:
                _simple(conn, setup)
        pool = ConnectionPool(self.url, min_size=self._sizes[0], max_size=self._sizes[1],
                              kwargs=kwargs, configure=configure, timeout=self.connect_timeout_s,
                              open=False, name=name)
        pool.open(wait=False)
        return pool

    def _connect_kwargs(self, settings: dict[str, str]) -> dict[str, Any]:
        """psycopg.connect keywords: settings as startup ``options`` where the server takes
        them (no round trip), and no automatic prepared statements behind a transaction pooler
        (psycopg names them ``_pg3_N`` per connection; another client's server session has
        them already, or not at all)."""
        kwargs: dict[str, Any] = {"autocommit": True,
                                  "connect_timeout": int(max(self.connect_timeout_s, 1))}
        if self._options_ok:
            kwargs["options"] = session_options(self.url, settings)
        if self.transaction_pooling:
            kwargs["prepare_threshold"] = None
        return kwargs

    @property
    def relaxed_pool(self) -> ConnectionPool:
        """Connections whose commits do not wait for the WAL flush.

        For statements whose loss in a server crash at-least-once already allows (acquire, ack,
        lease extension, release: a redelivery), and for publishes whose caller chose Redis-like
        durability (``durable=False``). A crash loses a suffix of such commits, never a gap.
        """
        with self._lock:
            if self._relaxed_pool is None:
                # Its statements are the hot path: fixed shapes on index keys, so one generic
                # plan serves every call (custom plans re-planned the poll on every execution:
                # ~0.2 ms of its ~0.75 ms). That plan is made once per connection and kept
                # until the table is next analyzed; made while the table was nearly empty (a
                # worker started before the publishers), it seq-scanned every poll, ack and
                # lease, 2-3 ms each on a few thousand rows. Seq scans off: the index is taken
                # whatever the size. Bitmap scans off: a bitmap index scan reads every entry in
                # its range, dead ones included, where an ordered index scan stops at LIMIT; a
                # plan re-made after an ANALYZE that counted few live rows chose one (issue 10).
                # Sorts off: with those statistics another index plus a sort looked as cheap
                # as the ordered scan; no hot statement needs a sort.
                # tests/integration/test_schema.py checks their plans.
                self._relaxed_pool = self._make_pool("delayq-relaxed", **RELAXED_SETTINGS)
            return self._relaxed_pool

    def _probe(self, *, detect: bool) -> None:
        """Connect once up front so a bad URL or a down server fails fast with libpq's reason,
        and (``detect``) find out whether session state holds.

        PgBouncer refuses the ``options`` startup parameter ("unsupported startup parameter")
        or, told to ignore it, drops it silently; either way the connection is not a session
        of delayq's own, and in its usual (transaction) mode nothing else survives a
        transaction either. The pool mode itself cannot be read through the pooler, so a
        detected pooler is taken as transaction pooling (correct in both modes);
        ``pooling="session"`` keeps the fast paths behind a session pooler.

        A process forked from one that probed the same URL (a prefork pool child) takes its
        parent's answer: probing again would open a second connection per child for a moment,
        one more than the connection budget of docs/how-to/managed-service.md counts per child
        (tests/topology/test_connection_budget.py saw 29 where the budget is 28). Within one
        process every Database probes: a server may have changed behind the same URL."""
        known = _PROBED.get((self.url, detect))
        if known is not None and known[0] != os.getpid():
            _, self._options_ok, self.identity = known
            self._after_probe(detect)
            return
        timeout = int(max(self.connect_timeout_s, 1))
        options = session_options(self.url, {**SESSION_SETTINGS, _MARKER: "on"})
        try:
            try:
                conn = psycopg.connect(self.url, connect_timeout=timeout, options=options)
            except psycopg.OperationalError as exc:
                if "unsupported startup parameter" not in str(exc):
                    raise
                conn = psycopg.connect(self.url, connect_timeout=timeout)
                self._options_ok = False
            with conn:
                if self._options_ok:
                    row = conn.execute(raw_queries()["session_marker"], {"name": _MARKER},
                                       prepare=False).fetchone()
                    self._options_ok = bool(row and row[0] == "on")
                self.identity = _identity_of(conn)
        except psycopg.Error as exc:
            raise translate(exc, self.url) from exc
        _PROBED[(self.url, detect)] = (os.getpid(), self._options_ok, self.identity)
        self._after_probe(detect)

    def _after_probe(self, detect: bool) -> None:
        if detect and not self._options_ok:
            self.transaction_pooling = True
            log.info("delayq: %s drops session settings (a pooler such as PgBouncer): "
                     "no named prepared statements, settings applied per transaction",
                     mask_password(self.url))

    def refresh_identity(self) -> tuple[str, ...]:
        """Read again which database the pool reaches (a failover or a restart since the
        probe): core/queue/joined.py asks before it refuses a caller's transaction as another
        one."""
        self.identity = self.run(_identity_of)
        return self.identity

    def connect(self, *, listen: bool = False, **kwargs: Any) -> psycopg.Connection[Any]:
        """A dedicated connection outside the pool (LISTEN needs one that stays put; with
        ``listen`` it goes to :attr:`listen_url`)."""
        url = self.listen_url if listen else self.url
        try:
            params = self._connect_kwargs(SESSION_SETTINGS)
            if listen and url != self.url:  # a direct server: it takes startup options
                params.update(options=session_options(url, SESSION_SETTINGS))
                params.pop("prepare_threshold", None)
            params.update(kwargs)
            return psycopg.connect(url, **params)
        except psycopg.Error as exc:
            raise translate(exc, url) from exc

    def run(
        self,
        work: Callable[[psycopg.Connection[Any]], T],
        *,
        idempotent: bool = True,
        relaxed: bool = False,
    ) -> T:
        """Run ``work`` on a pooled connection, retrying transient failures.

        ``work`` owns its transaction (connections are autocommit; use ``conn.transaction()``).
        ``relaxed`` picks a connection that commits without waiting for the WAL flush.
        """
        delays = None
        pool, begin = self.pool, self._begin
        if relaxed:  # the property takes a lock on every call: only the first one needs it
            pool = self._relaxed_pool if self._relaxed_pool is not None else self.relaxed_pool
            begin = self._relaxed_begin
        while True:
            try:
                return run_on_pooled(pool, work, begin)
            except TRANSIENT_ERRORS as exc:
                delays = delays or self.retry.delays()
                delay = next(delays, None)
                if delay is None or not idempotent:
                    raise translate(exc, self.url) from exc
                log.warning("delayq: transient database error, retrying in %.2fs: %s", delay, exc)
                time.sleep(delay)
            except psycopg.Error as exc:
                raise translate(exc, self.url) from exc

    def execute(
        self, query: str, params: dict[str, Any] | None = None, *, relaxed: bool = False
    ) -> int:
        """Run one statement; return its row count."""

        def work(conn: psycopg.Connection[Any]) -> int:
            return cursor_of(conn).execute(query, params).rowcount

        return self.run(work, relaxed=relaxed)

    def fetchall(
        self, query: str, params: dict[str, Any] | None = None, *, relaxed: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run one statement; return its rows."""
        def work(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            return cursor_of(conn).execute(query, params).fetchall()

        return self.run(work, relaxed=relaxed)

    def fetchone(self, query: str, params: dict[str, Any] | None = None) -> tuple[Any, ...] | None:
        """Run one statement; return its first row (None if none)."""
        def work(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            return cursor_of(conn).execute(query, params).fetchone()

        return self.run(work)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside one transaction, without the retry loop (caller retries)."""
        with self.pool.connection() as conn, conn.transaction():
            if self._begin is not None:
                _simple(conn, self._begin.removeprefix(b"BEGIN; "))
            yield conn

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    @property
    def has_relaxed_pool(self) -> bool:
        """Whether relaxed statements have a pool already (without opening one)."""
        return self._relaxed_pool is not None

    def close(self) -> None:
        """Close the pools (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.pool.close()
                if self._relaxed_pool is not None and self._relaxed_pool is not self.pool:
                    self._relaxed_pool.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_on_pooled(pool: ConnectionPool, work: Callable[[psycopg.Connection[Any]], T],
                  begin: bytes | None = None) -> T:
    """``work`` on a connection of ``pool``, with what ``with pool.connection()`` does (commit on
    success, rollback on error, return to the pool) minus its context managers: those cost
    ~11 us of client CPU per call (measured: 20 us vs 9 us), once per publish and per poll.

    ``begin`` (``BEGIN; SET LOCAL ...``): ``work`` runs inside a transaction opened with those
    settings, which hold on whichever server connection a pooler lends and end with it;
    ``work``'s own ``conn.transaction()`` becomes a savepoint."""
    conn = pool.getconn()
    try:
        if begin is not None:
            _simple(conn, begin)
        result = work(conn)
        if conn.pgconn.transaction_status != TransactionStatus.IDLE:
            conn.commit()
        return result
    except BaseException:
        if conn.pgconn.transaction_status in (TransactionStatus.INTRANS,
                                              TransactionStatus.INERROR):
            try:
                conn.rollback()
            except psycopg.Error as exc:  # a broken connection: the pool replaces it
                log.debug("delayq: rollback of a failed connection: %s", exc)
        raise
    finally:
        pool.putconn(conn)


def cursor_of(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """The connection's one reused cursor. ``conn.execute`` makes a cursor per statement, ~20 us
    of client CPU each time (measured: 94 vs 72 us for ``SELECT 1``); a pooled connection runs
    one statement at a time, so one cursor serves them all."""
    cur: psycopg.Cursor[Any] | None = getattr(conn, "_delayq_cursor", None)
    if cur is None or cur.closed:
        cur = conn.cursor()
        conn._delayq_cursor = cur  # type: ignore[attr-defined]
    return cur


def session_options(url: str, settings: dict[str, str]) -> str:
    """libpq ``options`` carrying ``settings``, followed by any ``options`` of the URL itself, so
    an operator's explicit ``-c`` (e.g. ``?options=-c%20jit%3Don``) still wins: set at connect
    time, they cost no round trip per connection."""
    ours = " ".join(f"-c {k}={v}" for k, v in settings.items())
    theirs = conninfo_to_dict(url).get("options")
    return f"{ours} {theirs}" if theirs else ours


def set_statement(settings: dict[str, str], *, local: bool) -> bytes:
    """``SET [LOCAL] name = 'value'; ...`` for delayq's own fixed settings (names and values
    are constants of this module, never user input)."""
    scope = "LOCAL " if local else ""
    return "; ".join(f"SET {scope}{name} = '{value}'" for name, value in settings.items()).encode()


def _simple(conn: psycopg.Connection[Any], statements: bytes) -> None:
    """Run ``statements`` through libpq's simple protocol (several per round trip, nothing
    prepared); raise psycopg's exception on failure."""
    result = conn.pgconn.exec_(statements)
    if result.status not in (ExecStatus.COMMAND_OK, ExecStatus.TUPLES_OK):
        if conn.pgconn.status == ConnStatus.BAD:
            raise psycopg.OperationalError(
                f"connection lost: {conn.pgconn.error_message.decode(errors='replace').strip()}")
        raise pg_errors.error_from_result(result, encoding=conn.info.encoding)


def _identity_of(conn: psycopg.Connection[Any]) -> tuple[str, ...]:
    """(database, cluster system identifier, cluster start) of the server ``conn`` reaches."""
    row = conn.execute(raw_queries()["database_identity"], prepare=False).fetchone()
    assert row is not None
    return tuple(str(v) for v in row)


def as_arrays(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """Transpose rows into one list per column, for ``unnest(%s::type[], ...)`` statements."""
    columns: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        for i, value in enumerate(row):
            columns[i].append(value)
    return columns
