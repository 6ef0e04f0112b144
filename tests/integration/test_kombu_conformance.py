"""kombu's own integration test classes, run against delayq (issue 3, item 7).

The classes come from ``t/integration/common.py`` in the sdist of the *installed* kombu version,
fetched from PyPI (and cached) when this module is collected; nothing of kombu's suite lives in
this repository. They are wired the way kombu's ``t/integration/test_redis.py`` wires them:
a ``connection`` fixture per test (a fresh queue table each), an ``invalid_connection`` one,
and Redis priority semantics (``PRIORITY_ORDER = 'desc'``: a lower number is served first).
Every class of ``common.py`` runs here but those ``NOT_APPLICABLE`` names (a test checks it).

The connections keep the transport's default fallback poll (``polling_interval``, 5 s): kombu
drains with 1 s timeouts, so a shorter one would deliver what a missing wake-up left behind and
hide it (issue 49: ``TestExchangeTypes::test_fanout`` and ``test_topic`` passed here on a 0.5 s
fallback poll while a queue a running connection started to consume waited 5 s).

If the sdist cannot be fetched, ``test_peer_suite_was_fetched`` fails with pip's reason (the
peer classes then contribute no tests): a failure, never a silent skip, and the rest of the
suite still runs (an exception at import would abort the whole session at collection).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import kombu
import pytest
from _kombu_peer import PeerSuiteUnavailable, load_common

from delayq_transport.transport import Transport
from delayq_transport.transport.options import DEFAULT_POLLING_INTERVAL_S

pytest_plugins = ("_kombu_env",)

try:
    common: Any = load_common()
    UNAVAILABLE = ""
except PeerSuiteUnavailable as exc:
    common, UNAVAILABLE = None, str(exc)

#: What the kombu classes run with besides the test environment's: the production fallback poll.
CONTRACT_OPTIONS = {"polling_interval": DEFAULT_POLLING_INTERVAL_S}
#: Classes of kombu's ``common.py`` not run here, and why; every other one must be.
NOT_APPLICABLE = {
    "BaseTimeToLive": "AMQP per-message expiration, which delayq (like kombu's Redis) lacks",
}


def peer(name: str, since: tuple[int, int] = (0, 0)) -> type:
    """One of kombu's test classes, or an empty base when the sdist could not be fetched or
    the installed kombu predates the class (scripts/check-compat runs the oldest kombu
    pyproject allows, whose own suite has no such tests). A class missing from a kombu at
    least ``since`` fails at import (AttributeError), it is not passed over."""
    if common is None or tuple(int(p) for p in kombu.__version__.split(".")[:2]) < since:
        return object
    return getattr(common, name)


@pytest.fixture
def connection(kombu_connect: Callable[..., kombu.Connection]) -> kombu.Connection:
    """What kombu's classes expect: an unopened connection to an empty broker."""
    return kombu_connect(**CONTRACT_OPTIONS)


@pytest.fixture
def invalid_connection() -> Iterator[kombu.Connection]:
    """Nothing listens on port 1: connecting must raise (kombu asserts *an* exception)."""
    conn = kombu.Connection("delayq+postgresql://postgres@127.0.0.1:1/postgres",
                            connect_timeout=2)
    yield conn
    conn.release()


@pytest.fixture
def failover_connection(kombu_db: str, kombu_table: str) -> Iterator[kombu.Connection]:
    """kombu's failover fixture shape (``t/integration/test_py_amqp.py``): a dead first URL
    (nothing listens on port 1), then the live database as the alternate.

    The alternate is spelled ``delayq+postgresql://``: kombu re-parses every alternate whole in
    ``Connection.switch`` and looks its full scheme up as a transport name (issue 11's
    ``KeyError: 'No such transport: delayq+postgresql'``). The first URL is spelled
    ``delayq://`` because kombu only fills ``Connection.port`` for a first URL it parses whole,
    and ``test_failover_switches_to_alternate_url`` compares that port with the dead URL's; a
    ``delayq+postgresql://`` first URL connects the same way (see
    ``test_kombu_storage_contract.py::test_failover_from_a_dead_host_to_the_next``).
    """
    from _kombu_env import BASE_OPTIONS  # after pytest_plugins loaded it (assert rewriting)

    live = urlsplit(kombu_db)
    dead = f"delayq://postgres@127.0.0.1:1{live.path}"
    conn = kombu.Connection(f"{dead};delayq+{kombu_db}", connect_timeout=2,
                            transport_options=dict(BASE_OPTIONS, table=kombu_table,
                                                   **CONTRACT_OPTIONS))
    yield conn
    conn.release()


def test_peer_suite_was_fetched_for_the_installed_kombu() -> None:
    if UNAVAILABLE:
        pytest.fail(UNAVAILABLE)
    assert f"kombu-{kombu.__version__}-t" in common.__file__  # not a stale cached version


def test_every_class_of_the_peer_suite_runs_here_or_says_why_not() -> None:
    """A kombu release that adds a class to its suite fails here until it is wired (or said
    not to apply)."""
    if UNAVAILABLE:
        pytest.fail(UNAVAILABLE)
    theirs = {name for name, value in vars(common).items()
              if isinstance(value, type) and value.__module__ == common.__name__}
    ours = {base.__name__ for value in globals().values()
            if isinstance(value, type) and value.__name__.startswith("TestDelayq")
            for base in value.__bases__}
    assert theirs - ours - set(NOT_APPLICABLE) == set()


class TestDelayqBasicFunctionality(peer("BasicFunctionality")):
    def test_failed_connection_is_a_declared_connection_error(
        self, invalid_connection: kombu.Connection
    ) -> None:
        """Like the Redis suite's check: kombu only retries errors the transport declares."""
        with pytest.raises(Transport.connection_errors) as info:
            invalid_connection.transport.establish_connection()
        assert "unreachable" in str(info.value)


class TestDelayqExchangeTypes(peer("BaseExchangeTypes")):
    pass


class TestDelayqMessage(peer("BaseMessage")):
    pass


class TestDelayqPriority(peer("BasePriority")):
    PRIORITY_ORDER = "desc"


class TestDelayqEventLoop(peer("BaseEventLoop", since=(5, 7))):
    pass


class TestDelayqFailover(peer("BaseFailover")):
    pass
