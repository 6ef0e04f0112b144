"""The opt-in ``unlogged_table`` mode (issue 11): what it does to the table, and what it refuses."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing

import kombu
import psycopg
import pytest

from delayq_transport import InvalidInput

pytestmark = pytest.mark.timeout(60)
pytest_plugins = ("_kombu_env",)

Connect = Callable[..., kombu.Connection]


def persistence(url: str, table: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT relpersistence FROM pg_class WHERE oid = %s::regclass",
                           (f'"{table}"',)).fetchone()
    assert row is not None
    return str(row[0])


def round_trip(conn: kombu.Connection) -> None:
    with closing(conn.SimpleQueue("unlogged")) as q:
        q.put({"n": 1})
        message = q.get(timeout=10)
        assert message.payload == {"n": 1}
        message.ack()


def test_unlogged_on_off_and_unset(kombu_connect: Connect, kombu_db: str, kombu_table: str):
    with kombu_connect() as conn:  # default: the table is created logged
        conn.connect()
        assert persistence(kombu_db, kombu_table) == "p"
    with kombu_connect(unlogged_table=True) as conn:
        conn.connect()
        assert persistence(kombu_db, kombu_table) == "u"
        round_trip(conn)
    with kombu_connect() as conn:  # unset leaves the operator's choice alone
        conn.connect()
        assert persistence(kombu_db, kombu_table) == "u"
    with kombu_connect(unlogged_table=False) as conn:
        conn.connect()
        assert persistence(kombu_db, kombu_table) == "p"
        round_trip(conn)


#: WAL bytes of the records that touch one table or its indexes (pg_walinspect), so WAL the
#: other databases of a shared server write meanwhile is not counted.
TABLE_WAL = """
SELECT coalesce(sum(w.record_length), 0)
FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn) AS w
WHERE EXISTS (
    SELECT 1 FROM pg_class AS c
    WHERE (c.oid = %(table)s::regclass
           OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %(table)s::regclass))
      AND w.block_ref LIKE '%%/' || pg_relation_filenode(c.oid) || ' %%')
"""


def test_unlogged_rows_write_no_wal(kombu_connect: Connect, kombu_db: str, kombu_table: str):
    """What the mode is for: publishes into an unlogged table write no WAL, where logged ones
    write hundreds of bytes each (the row and four index entries)."""
    with psycopg.connect(kombu_db, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")

    def wal_per_publish(**options: object) -> float:
        with kombu_connect(**options) as conn, closing(conn.SimpleQueue("w")) as q:
            q.put({"warm": True})
            with psycopg.connect(kombu_db, autocommit=True) as admin:
                start = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
                for i in range(100):
                    q.put({"n": i})
                # A synchronous commit flushes the WAL past the publishes (they skip the flush
                # wait, and pg_walinspect reads flushed WAL only).
                with admin.transaction():
                    admin.execute("SELECT txid_current()")
                end = admin.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
                row = admin.execute(TABLE_WAL, {"start": start, "end": end,
                                                "table": f'"{kombu_table}"'}).fetchone()
            return float(row[0]) / 100

    logged = wal_per_publish(unlogged_table=False)
    unlogged = wal_per_publish(unlogged_table=True)
    assert logged > 100, logged
    assert unlogged == 0, unlogged


def test_unlogged_and_durable_publish_are_refused_together(kombu_connect: Connect):
    conn = kombu_connect(unlogged_table=True, durable_publish=True)
    with pytest.raises(InvalidInput, match="choose one"):
        conn.transport  # noqa: B018 - building the transport validates the options
