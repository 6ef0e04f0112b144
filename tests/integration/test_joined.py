"""Publishing in the caller's transaction (issue 34), with each kind of connection an
application holds: psycopg 3, psycopg2, SQLAlchemy 2 Connection and Session on both dialects.

What each test holds against real PostgreSQL: a task written in the caller's transaction is
invisible until it commits (and its wake-up arrives only then), gone when it rolls back or its
savepoint does, costs one round trip and no commit of delayq's own, never touches delayq's pool
(``requests_num`` of both pools), never changes the caller's transaction, and is refused on
another database. The Celery, Dramatiq and Django front ends are in tests/acceptance.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg2
import psycopg2.extensions
import pytest
import sqlalchemy as sa
from conftest import create_database, drop_database
from psycopg.pq import Trace
from sqlalchemy.orm import Session

from delayq_transport import DelayedQueue, OfferOutcome, TransactionRefused, transaction
from delayq_transport.core import InvalidInput
from delayq_transport.core.db.queries import notify_channel

#: Bytes a text-format path could mangle: NUL, quotes, backslashes, non-UTF-8.
PAYLOAD = b"\x00'\"\\x\xff{}"


class Client:
    """One application connection inside its transaction: the object handed to
    ``transaction()``, a way to run the application's own SQL in the same transaction, commit
    and rollback (as the application would, never delayq)."""

    def __init__(self, handle: Any, execute: Callable[[str], Any], commit: Callable[[], Any],
                 rollback: Callable[[], Any], close: Callable[[], Any]) -> None:
        self.handle, self.execute = handle, execute
        self.commit, self.rollback, self.close = commit, rollback, close


def _psycopg3(url: str) -> Client:
    conn = psycopg.connect(url)
    return Client(conn, conn.execute, conn.commit, conn.rollback, conn.close)


def _psycopg2(url: str) -> Client:
    conn = psycopg2.connect(url)
    return Client(conn, lambda s: conn.cursor().execute(s), conn.commit, conn.rollback,
                  conn.close)


def _sa_engine(url: str, driver: str) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", f"postgresql+{driver}://", 1),
                            poolclass=sa.NullPool)


def _sa_connection(url: str, driver: str) -> Client:
    engine = _sa_engine(url, driver)
    conn = engine.connect()
    conn.begin()

    def close() -> None:
        conn.close()
        engine.dispose()

    return Client(conn, conn.exec_driver_sql, conn.commit, conn.rollback, close)


def _sa_session(url: str, driver: str) -> Client:
    engine = _sa_engine(url, driver)
    session = Session(engine)

    def close() -> None:
        session.close()
        engine.dispose()

    return Client(session, lambda s: session.execute(sa.text(s)), session.commit,
                  session.rollback, close)


CLIENTS: dict[str, Callable[[str], Client]] = {
    "psycopg": _psycopg3,
    "psycopg2": _psycopg2,
    "sqlalchemy-connection-psycopg": lambda u: _sa_connection(u, "psycopg"),
    "sqlalchemy-connection-psycopg2": lambda u: _sa_connection(u, "psycopg2"),
    "sqlalchemy-session-psycopg": lambda u: _sa_session(u, "psycopg"),
    "sqlalchemy-session-psycopg2": lambda u: _sa_session(u, "psycopg2"),
}


@pytest.fixture(params=sorted(CLIENTS))
def client(request: pytest.FixtureRequest, database_url: str) -> Iterator[Client]:
    made = CLIENTS[request.param](database_url)
    made.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
    made.commit()
    yield made
    made.close()


def pool_requests(queue: DelayedQueue) -> int:
    """Connections ever asked of delayq's pools (the relaxed one too, if it exists)."""
    pools = [queue.db.pool] + ([queue.db.relaxed_pool] if queue.db.has_relaxed_pool else [])
    return sum(p.get_stats().get("requests_num", 0) for p in pools)


def keys_in_table(url: str) -> dict[str, bytes]:
    """What another session sees: committed rows only."""
    with psycopg.connect(url, autocommit=True) as conn:
        return {k: bytes(p) for k, p in conn.execute(
            'SELECT "pKey", payload FROM delayed_queue').fetchall()}


def test_pool_requests_counts_a_normal_publish(queue: DelayedQueue) -> None:
    """The probe the tests below rely on moves when delayq's pool is used."""
    before = pool_requests(queue)
    queue.offer("own", b"x")
    assert pool_requests(queue) > before


def test_tasks_are_written_in_the_callers_transaction_and_seen_after_its_commit(
        client: Client, queue: DelayedQueue, database_url: str) -> None:
    before = pool_requests(queue)
    with listening(database_url) as heard:
        client.execute("INSERT INTO orders VALUES ('o1')")
        with transaction(client.handle):
            assert queue.offer("t1", PAYLOAD) is OfferOutcome.CREATED
            assert queue.offer_batch([("t2", b"2", None), ("t3", b"3", None)]) == \
                [OfferOutcome.CREATED] * 2
        assert pool_requests(queue) == before  # not one connection of delayq's own
        assert keys_in_table(database_url) == {}  # not committed: nothing to see
        assert heard() == []  # and no wake-up yet
        client.commit()
        assert keys_in_table(database_url) == {"t1": PAYLOAD, "t2": b"2", "t3": b"3"}
        # Both publishes notify "test:<the transaction's start>", which PostgreSQL sends once.
        assert [p.split(":")[0] for p in heard()] == ["test"]


def test_a_rollback_leaves_nothing(client: Client, queue: DelayedQueue,
                                   database_url: str) -> None:
    with listening(database_url) as heard:
        with transaction(client.handle):
            queue.offer("gone", b"x")
            queue.offer_batch([("gone2", b"y", None)])
        client.rollback()
        assert keys_in_table(database_url) == {}
        assert heard() == []


def test_a_rolled_back_savepoint_drops_its_tasks_and_keeps_the_others(
        client: Client, queue: DelayedQueue, database_url: str) -> None:
    with transaction(client.handle):
        queue.offer("before", b"1")
        client.execute("SAVEPOINT inner_sp")
        queue.offer("inside", b"2")
        client.execute("ROLLBACK TO SAVEPOINT inner_sp")
        queue.offer("after", b"3")
    client.commit()
    assert sorted(keys_in_table(database_url)) == ["after", "before"]


def test_framework_savepoints_drop_their_tasks(queue: DelayedQueue, database_url: str) -> None:
    """psycopg's nested ``transaction()`` and SQLAlchemy's ``begin_nested()``."""
    with psycopg.connect(database_url) as conn, conn.transaction(), transaction(conn):
        queue.offer("p-kept", b"1")
        with pytest.raises(RuntimeError), conn.transaction():
            queue.offer("p-dropped", b"2")
            raise RuntimeError("the inner block fails: its savepoint rolls back")
    engine = _sa_engine(database_url, "psycopg2")
    with Session(engine) as session, session.begin(), transaction(session):
        queue.offer("s-kept", b"3")
        nested = session.begin_nested()
        queue.offer("s-dropped", b"4")
        nested.rollback()
    engine.dispose()
    assert sorted(keys_in_table(database_url)) == ["p-kept", "s-kept"]


def test_a_publish_is_one_round_trip_and_never_ends_or_changes_the_transaction(
        queue: DelayedQueue, database_url: str) -> None:
    """psycopg's libpq trace: one Query message per publish (NOTIFY and insert together), no
    COMMIT, ROLLBACK, SET or savepoint; the isolation level the caller chose is kept."""
    conn = psycopg.connect(database_url)
    conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    with transaction(conn):
        queue.offer("warm", b"x")  # reads this connection's database identity once
        with traced(conn) as messages:
            queue.offer("a", b"1")
            queue.offer("b", b"2", can_update=False)
            queue.offer_batch([("c", b"3", None), ("d", b"4", None)])
    sent = messages()
    assert [m.split("\t")[2] for m in sent] == ["Query"] * 3, sent
    assert not any(w in m for m in sent for w in ("COMMIT", "ROLLBACK", "SET ", "SAVEPOINT"))
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert conn.execute("SHOW transaction_isolation").fetchone() == ("serializable",)
    conn.commit()
    conn.close()
    assert sorted(keys_in_table(database_url)) == ["a", "b", "c", "d", "warm"]


class CountingCursor(psycopg2.extensions.cursor):
    """Records every text psycopg2 sends (one ``execute`` is one round trip)."""

    sent: list[str] = []

    def execute(self, query: Any, vars: Any = None) -> Any:
        CountingCursor.sent.append(str(query))
        return super().execute(query, vars)


def test_psycopg2_sends_one_statement_text_per_publish_with_its_values_intact(
        queue: DelayedQueue, database_url: str) -> None:
    """psycopg2 fills in the same ``%(x)s`` text: bytea with NUL bytes, quotes in keys,
    NULL elements of the batch's arrays, and an ETA all come back exactly."""
    conn = psycopg2.connect(database_url, cursor_factory=CountingCursor)
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    with transaction(conn):
        queue.offer("warm", b"x")
        CountingCursor.sent.clear()
        queue.offer("it's \"q\"", PAYLOAD, at)
        queue.offer_batch([("n1", PAYLOAD, None), ("n2", b"", at)])
    sent = list(CountingCursor.sent)
    assert len(sent) == 2 and all("pg_notify" in s and "INSERT INTO" in s for s in sent)
    assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_INTRANS
    conn.commit()
    conn.close()
    assert keys_in_table(database_url) == {"warm": b"x", "it's \"q\"": PAYLOAD,
                                           "n1": PAYLOAD, "n2": b""}
    row = queue.get("it's \"q\"")
    assert row is not None and row.scheduled_at == at


def test_replacing_an_existing_key_happens_inside_the_transaction(
        client: Client, queue: DelayedQueue, database_url: str) -> None:
    queue.offer("k", b"old")
    with transaction(client.handle):
        assert queue.offer("k", b"new") is OfferOutcome.UPDATED
        assert queue.offer("k", b"other", can_update=False) is OfferOutcome.IGNORED
    assert keys_in_table(database_url) == {"k": b"old"}
    client.commit()
    assert keys_in_table(database_url) == {"k": b"new"}


def test_a_transaction_on_another_database_is_refused_naming_both(
        queue: DelayedQueue, database_url: str) -> None:
    other_name = f"delayq_other_{uuid.uuid4().hex[:8]}"
    other_url = create_database(other_name)
    try:
        with psycopg.connect(other_url) as conn, transaction(conn):
            with pytest.raises(TransactionRefused) as refused:
                queue.offer("lost", b"x")
            with pytest.raises(TransactionRefused):
                queue.offer_batch([("lost2", b"x", None)])
        message = str(refused.value)
        assert other_name in message and database_url.rsplit("/", 1)[1] in message
        assert keys_in_table(database_url) == {}
    finally:
        drop_database(other_name)


def test_what_is_not_a_transaction_is_refused(queue: DelayedQueue, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn, transaction(conn):
        with pytest.raises(TransactionRefused, match="autocommit"):
            queue.offer("a", b"x")
    with psycopg.connect(database_url) as conn, transaction(conn):
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(TransactionRefused, match="aborted"):
            queue.offer("b", b"x")
    engine = _sa_engine(database_url, "psycopg").execution_options(
        isolation_level="AUTOCOMMIT")
    with engine.connect() as conn, transaction(conn):
        with pytest.raises(TransactionRefused, match="autocommit"):
            queue.offer("c", b"x")
    engine.dispose()
    with pytest.raises(InvalidInput, match="cannot publish in a transaction of"):
        with transaction(object()):
            pass
    assert keys_in_table(database_url) == {}


def test_a_stale_broker_identity_is_read_again_before_refusing(
        queue: DelayedQueue, database_url: str) -> None:
    """A failover or restart since delayq connected changes what the server reports."""
    real = queue.db.identity
    queue.db.identity = ("stale", "0", "then")
    with psycopg.connect(database_url) as conn, transaction(conn):
        assert queue.offer("ok", b"x") is OfferOutcome.CREATED
    assert queue.db.identity == real


def test_outside_a_block_publishing_is_delayqs_own(queue: DelayedQueue,
                                                   database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        with transaction(conn):
            queue.offer("in", b"x")
        before = pool_requests(queue)
        queue.offer("out", b"y")  # committed at once, on delayq's pool
        assert pool_requests(queue) > before
        assert keys_in_table(database_url) == {"out": b"y"}
        conn.rollback()


@pytest.mark.parametrize("name", ["psycopg", "psycopg2"])
def test_a_callers_connection_is_not_kept_alive(name: str, queue: DelayedQueue,
                                                database_url: str) -> None:
    """A process opening a connection per request must not accumulate them in delayq."""
    import gc
    import weakref

    conn = CLIENTS[name](database_url).handle
    with transaction(conn):
        queue.offer(f"gc-{name}", b"x")
    conn.commit()
    conn.close()
    ref = weakref.ref(conn)
    del conn
    gc.collect()
    assert ref() is None


# -- helpers -------------------------------------------------------------------------------


@contextmanager
def listening(url: str) -> Iterator[Callable[[], list[str]]]:
    """A LISTEN connection on the table's channel; ``heard()`` returns the notifications that
    arrived since the last call, once a marker NOTIFY committed after them came back (so
    "none" means none committed before the marker, not "none yet")."""
    channel = notify_channel("delayed_queue")
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f'LISTEN "{channel}"')

    def heard() -> list[str]:
        marker = uuid.uuid4().hex
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, %s)", (channel, marker))
        got = []
        for note in conn.notifies(timeout=10):
            if note.payload == marker:
                return got
            got.append(note.payload)
        raise AssertionError(f"the marker NOTIFY never arrived (got {got})")

    try:
        yield heard
    finally:
        conn.close()


@contextmanager
def traced(conn: psycopg.Connection[Any]) -> Iterator[Callable[[], list[str]]]:
    """The frontend messages libpq sends on ``conn`` inside the block."""
    fd, path = tempfile.mkstemp()
    lines: list[str] = []
    conn.pgconn.trace(fd)
    conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
    try:
        yield lambda: lines
    finally:
        conn.pgconn.untrace()
        os.close(fd)
        with open(path) as f:
            lines += [ln for ln in f.read().split("\n") if ln.startswith("F\t")]
        os.unlink(path)
