"""Shared fixtures: real PostgreSQL, one migrated template database per session, and a fresh
``CREATE DATABASE ... TEMPLATE`` copy per test (isolated and fast, as procrastinate does)."""

from __future__ import annotations

import os
import uuid
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


@pytest.fixture
def database_url(template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    with template_copy(template_db) as url:
        yield url


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
