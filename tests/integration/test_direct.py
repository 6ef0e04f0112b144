"""The per-publish insert run on libpq itself (core/db/direct.py), against a real PostgreSQL.

It bypasses psycopg's cursor, so what the cursor did for free is checked here: the statement
is prepared on each connection, prepared again when the session dropped it, errors still
become delayq's errors, a lost connection is still retried, and values of every shape arrive
as they were sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from delayq_transport import DelayedQueue, OfferOutcome
from delayq_transport.core import SchemaMissing
from delayq_transport.core.db.direct import DirectStatement

CREATED = OfferOutcome.CREATED


@pytest.fixture
def one_conn(database_url: str) -> Iterator[DelayedQueue]:
    """A queue whose pools hold one connection each, so each test knows which one it hits."""
    with DelayedQueue(database_url, kind="direct", pool_max_size=1) as q:
        yield q


def stored_keys(q: DelayedQueue) -> list[str]:
    rows = q.db.fetchall(f'SELECT "pKey" FROM {q.table} WHERE "pKind" = %(k)s ORDER BY id',
                         {"k": q.kind})
    return [r[0] for r in rows]


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "relaxed"])
def test_prepared_again_after_the_session_discarded_it(one_conn: DelayedQueue, durable: bool):
    assert one_conn.offer("before", b"1", durable=durable) is CREATED
    pool = one_conn.db.pool if durable else one_conn.db.relaxed_pool
    with pool.connection() as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM pg_prepared_statements")]
        assert any(n.startswith("delayq_offer_insert_") for n in names), names
        conn.execute("DISCARD ALL")  # what a pooler's reset or another library may send
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
    assert one_conn.offer("after", b"2", durable=durable) is CREATED
    assert stored_keys(one_conn) == ["before", "after"]


def test_a_killed_connection_is_retried_and_stores_once(one_conn: DelayedQueue, database_url: str):
    assert one_conn.offer("first", b"1", durable=False) is CREATED
    with one_conn.db.relaxed_pool.connection() as conn:
        pid = conn.info.backend_pid
    with psycopg.connect(database_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    assert one_conn.offer("second", b"2", durable=False) is CREATED
    assert stored_keys(one_conn) == ["first", "second"]


def test_a_missing_table_is_named_with_what_to_do(database_url: str):
    with DelayedQueue(database_url, kind="direct", table="never_migrated",
                      ensure_schema=False) as q, \
            pytest.raises(SchemaMissing, match=r"never_migrated.*delayq migrate"):
        q.offer("k", b"x")


def test_values_of_every_shape_arrive_as_sent(queue: DelayedQueue):
    payload = bytes(range(256)) * 3  # NUL bytes, high bytes: bytea goes in binary
    at = datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    assert queue.offer("clé-ü-🙂", payload, at) is CREATED
    before = queue.now()
    assert queue.offer("empty", b"", None) is CREATED
    after = queue.now()
    row = queue.get("clé-ü-🙂")
    assert row is not None and row.payload == payload
    assert row.scheduled_at == at
    empty = queue.get("empty")
    assert empty is not None and empty.payload == b""
    assert before <= empty.scheduled_at <= after  # due now: the database's now at the insert


def test_placeholders_become_positional_once_per_name():
    stmt = DirectStatement("t", "SELECT %(a)s, %(b)b, %(a)s, 100 %% 7")
    assert stmt.sql == b"SELECT $1, $2, $1, 100 % 7"
    assert stmt.names == ("a", "b") and stmt.formats == [0, 1]
    with pytest.raises(ValueError, match="both as text and as binary"):
        DirectStatement("t", "SELECT %(a)s, %(a)b")
    with pytest.raises(ValueError, match="placeholder"):
        DirectStatement("t", "SELECT %s")


def test_arrays_flags_and_nulls_bind_as_sent(queue: DelayedQueue):
    """The poll binds its kinds and floors as array literals: quoting must survive every
    character a queue name may hold."""
    kinds = ["plain", 'quo"te', "back\\slash", "é:ü 🙂", "", "{brace},comma", "NULL"]
    stmt = DirectStatement("echo", """
        SELECT cardinality(%(kinds)s::text[]), array_to_json(%(kinds)s::text[])::text,
               array_to_json(%(lows)s::bigint[])::text, %(flag)s::boolean::text,
               %(nothing)s::bigint, %(blob)b::bytea""")
    with queue.db.pool.connection() as conn:
        [row] = stmt.rows(conn, {"kinds": kinds, "lows": [None, -5, 2**62], "flag": False,
                                 "nothing": None, "blob": b"\x00\xff"})
    assert row[0] == len(kinds)
    assert json.loads(row[1]) == kinds
    assert json.loads(row[2]) == [None, -5, 2**62]
    assert row[3:] == ("false", None, b"\x00\xff")
