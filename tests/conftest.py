"""Shared fixtures: real PostgreSQL, one migrated template database per session, and a fresh
``CREATE DATABASE ... TEMPLATE`` copy per test (isolated and fast, as procrastinate does)."""

from __future__ import annotations

import functools
import os
import traceback
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from delayq_transport import Database, DelayedQueue, migrate

BASE_URL = os.environ.get(
    "DELAYQ_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def url_for(dbname: str, base: str = BASE_URL) -> str:
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def admin() -> psycopg.Connection:
    return psycopg.connect(BASE_URL, autocommit=True)


def create_database(name: str, template: str | None = None) -> str:
    with admin() as conn:
        tpl = f" TEMPLATE {template}" if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{tpl}')
    return url_for(name)


def drop_database(name: str) -> None:
    with admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: Every Database made in this process: (weak reference, the test that made it, where).
_MADE: list[tuple[weakref.ref[Database], str, str]] = []
_MAKING = ["(no test)"]
_database_init = Database.__init__


@functools.wraps(_database_init)  # keeps the real signature (docs/_gen/reference.py reads it)
def _tracked_init(self: Database, *args: Any, **kwargs: Any) -> None:
    _database_init(self, *args, **kwargs)
    where = "".join(f for f in traceback.format_stack()[:-1] if "/site-packages/" not in f)
    _MADE.append((weakref.ref(self), _MAKING[0], where))


Database.__init__ = _tracked_init  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _no_pool_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test must close every Database (and so its pools) it made, by the end of its own
    teardown: a pool left open keeps reconnecting to a test database that was dropped, and
    reports it from its thread long after the test ("error connecting in 'delayq'")."""
    _MAKING[0] = request.node.nodeid
    yield
    _MAKING[0] = "(no test)"
    mine = [(ref(), where) for ref, who, where in _MADE if who == request.node.nodeid]
    left = [(db, where) for db, where in mine if db is not None and not db._closed]
    _MADE[:] = [m for m in _MADE if m[1] != request.node.nodeid]
    for db, _ in left:
        db.close()  # so one leak fails one test, not every later one's output
    assert not left, f"{len(left)} Database(s) made by this test were never closed, made at:\n" \
        + "\n".join(where for _, where in left)


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    """A database with delayq's schema applied to the default table; copied per test."""
    try:
        admin().close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {BASE_URL}: {exc}")
    name = f"delayq_tpl_{os.getpid()}"
    drop_database(name)
    url = create_database(name)
    with Database(url) as db:
        migrate(db, "delayed_queue")
    yield name
    drop_database(name)


@contextmanager
def template_copy(template: str, prefix: str = "delayq_t") -> Iterator[str]:
    """A fresh copy of the migrated template database, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    url = create_database(name, template=template)
    try:
        yield url
    finally:
        drop_database(name)


#: ``transaction`` or ``session``: every test's database_url goes through a PgBouncer of that
#: pool mode (tests/topology/test_pgbouncer.py runs a part of the suite this way).
POOLER = os.environ.get("DELAYQ_TEST_POOLER", "")


@pytest.fixture(scope="session")
def pooler() -> Iterator[Any]:
    """The PgBouncer of DELAYQ_TEST_POOLER (None without it): one for the whole run."""
    if not POOLER:
        yield None
        return
    from topology.pgbouncer import PgBouncer

    bouncer = PgBouncer(BASE_URL, mode=POOLER,
                        ignore_options=os.environ.get("DELAYQ_TEST_POOLER_IGNORE") == "1")
    bouncer.start()
    yield bouncer
    bouncer.stop()


@pytest.fixture
def database_url(template_db: str, pooler: Any) -> Iterator[str]:
    """A fresh, migrated database for one test (through PgBouncer with DELAYQ_TEST_POOLER)."""
    with template_copy(template_db) as url:
        yield url if pooler is None else pooler.url(url)


@pytest.fixture
def queue(database_url: str) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind="test") as q:
        yield q


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local Spark session of a test run (a JVM has one): 2 threads, and a failed task
    is retried once (``local[2,2]``), which the idempotency tests rely on."""
    from delayq_transport.spark import local_session

    session = local_session("delayq-tests", master="local[2,2]")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


#: Session fixtures that start something heavy (Spark's JVM): their users in one tier share a
#: pytest-xdist process: one at once per tier, as when each tier had a process of its own (three
#: Spark test files in three processes at once timed out on a loaded machine).
HEAVY_SESSIONS = ("spark",)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n N --dist loadgroup`` (scripts/test): tests of one group run in one
    process, one after another; the others are dealt out one by one. A test marked
    ``xdist_group`` shares a fixed resource with other files (a Redis database number, a count
    of the whole server's sessions); a test that uses a module-scoped fixture (a table of
    millions of rows) stays with its module, which builds it once; the users of a heavy session
    fixture share one process per tier (HEAVY_SESSIONS). Without xdist the marks change nothing."""
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            _group_by_fixtures(item)
    if getattr(config.option, "loadgroup", False):  # a pytest-xdist worker under --dist loadgroup
        for item in items:
            _tell_xdist_the_group(item)


def _group_by_fixtures(item: pytest.Item) -> None:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    heavy = [n for n in HEAVY_SESSIONS if n in item.fixturenames]
    if heavy:
        item.add_marker(pytest.mark.xdist_group(f"{heavy[0]}-in-{item.path.parent.name}"))
    elif any(d[-1].scope in ("module", "package", "class") for d in defs.values() if d):
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def _tell_xdist_the_group(item: pytest.Item) -> None:
    """pytest-xdist (3.8) tells its scheduler a test's group by renaming the test
    ``<nodeid>@<group>`` through ``item._nodeid``, which pytest 9.2 no longer reads (a node's id
    is ``item._id``): without this every group would be dealt out test by test. Renamed here the
    same way (should pytest-xdist's renaming work again, its scheduler reads the last ``@``)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None or "@" in item.nodeid.rpartition("]")[2] or not hasattr(item, "_id"):
        return
    from _pytest.nodeid import NodeId

    name = mark.args[0] if mark.args else mark.kwargs.get("name", "default")
    item._id = NodeId.parse(f"{item.nodeid}@{name}")
