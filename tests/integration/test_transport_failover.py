"""Multi-host broker URLs (issue 11): kombu's failover list and libpq's own ``host=a,b``.

kombu's peer ``BaseFailover`` class runs in test_kombu_conformance.py; these pin what it does
not: a ``delayq+postgresql://`` *first* URL that is dead, credentials that need quoting once
kombu has split an alternate into parts, and the libpq multi-host form that never involves
kombu's failover at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from urllib.parse import urlsplit

import kombu
import kombu.exceptions
import pytest

import delayq_transport  # noqa: F401  (registers the schemes)

pytestmark = pytest.mark.timeout(60)
pytest_plugins = ("_kombu_env",)

#: Nothing listens there: the connection is refused at once (no timeout to wait out).
DEAD = "127.0.0.1:1"


@pytest.fixture
def opened() -> Iterator[list[kombu.Connection]]:
    conns: list[kombu.Connection] = []
    yield conns
    for conn in conns:
        conn.release()


def _connect(url: str, table: str, opened: list[kombu.Connection]) -> kombu.Connection:
    conn = kombu.Connection(url, connect_timeout=2,
                            transport_options={"table": table, "polling_interval": 0.5})
    opened.append(conn)
    return conn


def _round_trip(conn: kombu.Connection) -> None:
    with closing(conn.SimpleQueue("failover")) as q:
        q.put({"n": 1})
        message = q.get(timeout=10)
        assert message.payload == {"n": 1}
        message.ack()


def test_failover_from_a_dead_host_to_the_next(kombu_db: str, kombu_table: str,
                                               opened: list[kombu.Connection]) -> None:
    """The issue's spelling: both URLs ``delayq+postgresql://``, the first one dead."""
    live = urlsplit(kombu_db)
    url = f"delayq+postgresql://postgres@{DEAD}{live.path};delayq+{kombu_db}"
    conn = _connect(url, kombu_table, opened)
    assert conn.connect() and conn.connected
    assert conn.transport_cls == "delayq+postgresql"
    assert (conn.hostname, conn.port) == (live.hostname, live.port)
    _round_trip(conn)


def test_failover_alternate_credentials_are_quoted_again(kombu_db: str, kombu_table: str,
                                                         opened: list[kombu.Connection]) -> None:
    """kombu unquotes an alternate's user and password; a password with ``@`` and ``/`` must
    still reach libpq as one password (the test server trusts localhost, so any password is
    accepted, but a mangled URL is not)."""
    live = urlsplit(kombu_db)
    alternate = f"delayq+postgresql://postgres:p%40ss%2Fw%3Ard@{live.hostname}:{live.port}{live.path}"
    conn = _connect(f"delayq://postgres@{DEAD}{live.path};{alternate}", kombu_table, opened)
    assert conn.connect()
    assert conn.password == "p@ss/w:rd"
    _round_trip(conn)


def test_libpq_multi_host_url_skips_a_dead_host(kombu_db: str, kombu_table: str,
                                                opened: list[kombu.Connection]) -> None:
    """``host=a,b`` in URL form: libpq (psycopg) tries each host in turn, inside one kombu
    connection, for the pool's every new connection too."""
    live = urlsplit(kombu_db)
    url = f"delayq+postgresql://postgres@{DEAD},{live.hostname}:{live.port}{live.path}"
    conn = _connect(url, kombu_table, opened)
    assert conn.connect()
    assert conn.alt == []  # not kombu's failover: one URL, two hosts
    _round_trip(conn)


def test_every_alternate_dead_is_a_declared_connection_error(
        kombu_table: str, opened: list[kombu.Connection]) -> None:
    """kombu retries only errors the transport declares; with no host left it must raise one
    of them (not hang, not a KeyError on the alternate's scheme)."""
    url = f"delayq+postgresql://postgres@{DEAD}/x;delayq+postgresql://postgres@127.0.0.1:2/x"
    conn = _connect(url, kombu_table, opened)
    with pytest.raises(kombu.exceptions.OperationalError) as info:
        conn.ensure_connection(max_retries=2, interval_start=0, interval_step=0)
    # kombu wraps only errors in the transport's connection_errors this way.
    assert isinstance(info.value.__cause__, conn.transport.connection_errors)
    assert "unreachable" in str(info.value)
