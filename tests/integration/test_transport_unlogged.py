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


@pytest.mark.alone
def test_unlogged_rows_write_no_wal(kombu_connect: Connect, kombu_db: str):
    """What the mode is for: publishes into an unlogged table write no WAL for the row and its
    four index entries, where logged ones write hundreds of bytes each. Measured as the WAL
    insert position's advance over 100 publishes (the test runs alone on the cluster; what is
    left for unlogged publishes is their commit records)."""

    def wal_per_publish(**options: object) -> float:
        with kombu_connect(**options) as conn, closing(conn.SimpleQueue("w")) as q:
            q.put({"warm": True})
            with psycopg.connect(kombu_db, autocommit=True) as admin:
                lsn = "SELECT pg_current_wal_insert_lsn()"
                start = admin.execute(lsn).fetchone()[0]
                for i in range(100):
                    q.put({"n": i})
                end = admin.execute(lsn).fetchone()[0]
                row = admin.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, start)).fetchone()
            return float(row[0]) / 100

    logged = wal_per_publish(unlogged_table=False)
    unlogged = wal_per_publish(unlogged_table=True)
    assert logged > 300, logged
    assert unlogged < logged / 3, (unlogged, logged)


def test_unlogged_and_durable_publish_are_refused_together(kombu_connect: Connect):
    conn = kombu_connect(unlogged_table=True, durable_publish=True)
    with pytest.raises(InvalidInput, match="choose one"):
        conn.transport  # noqa: B018 - building the transport validates the options
