"""Fixtures for kombu-level tests: one database per module, one fresh queue table per test.

A ``CREATE DATABASE`` + ``DROP DATABASE WITH (FORCE)`` per test costs more than most kombu
tests themselves (the drop checkpoints). A table of its own is as isolated for the transport:
rows, bindings and the NOTIFY channel are all named after the table. Import the fixtures into
a test module with ``pytest_plugins = ("_kombu_env",)``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kombu
import psycopg
import pytest
from conftest import template_copy

import delayq_transport  # noqa: F401  (registers the delayq+ scheme)

#: Defaults of these tests: a short fallback poll (nothing may hang on a missed NOTIFY) and a
#: lease long enough that nothing is redelivered behind a test's back.
BASE_OPTIONS: dict[str, Any] = {"polling_interval": 0.5, "acquire_timeout": 30}

Connect = Callable[..., kombu.Connection]


@pytest.fixture(scope="module")
def kombu_db(template_db: str) -> Iterator[str]:
    """A migrated database shared by one test module."""
    with template_copy(template_db, "delayq_k") as url:
        yield url


@pytest.fixture
def kombu_table() -> str:
    """A queue table no other test uses (the transport creates it on first connect)."""
    return f"kq_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def kombu_connect(kombu_db: str, kombu_table: str) -> Iterator[Connect]:
    """Open kombu connections to this test's table; all are released at teardown."""
    opened: list[kombu.Connection] = []

    def open_(url: str | None = None, **options: Any) -> kombu.Connection:
        opts = dict(BASE_OPTIONS, table=kombu_table, **options)
        conn = kombu.Connection(url or "delayq+" + kombu_db, transport_options=opts)
        opened.append(conn)
        return conn

    yield open_
    for conn in opened:
        conn.release()


@pytest.fixture
def stored(kombu_db: str, kombu_table: str) -> Callable[[], list[dict[str, Any]]]:
    """Reads this test's queue table, oldest row first: what the transport really wrote."""
    query = psycopg.sql.SQL("SELECT * FROM {} ORDER BY id").format(
        psycopg.sql.Identifier(kombu_table))

    def read() -> list[dict[str, Any]]:
        with psycopg.connect(kombu_db, autocommit=True) as conn:
            cur = conn.cursor(row_factory=psycopg.rows.dict_row)
            return cur.execute(query).fetchall()

    return read
