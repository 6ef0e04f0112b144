"""Shared by the plan tests: a named statement rewritten for ``PREPARE``, and its plan."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg

from delayq_transport.core.db.direct import DirectStatement


def as_prepared(query: str) -> tuple[str, str, list[str]]:
    """``query`` with its ``%(name)s`` parameters turned into ``$n`` (each name once, in order
    of first use), a fresh statement name, and the parameter names in ``$n`` order: the form
    delayq's hot statements are prepared in (core/db/direct.py)."""
    statement = DirectStatement("plan", query)
    return statement.sql.decode(), f"p_{uuid.uuid4().hex[:8]}", list(statement.names)


def explain_prepared(conn: psycopg.Connection[Any], query: str, mode: str,
                     params: Mapping[str, Any]) -> dict[str, Any]:
    """EXPLAIN ANALYZE of ``query`` prepared as delayq prepares it, under ``plan_cache_mode``
    ``mode`` (the session's other settings untouched), in a transaction rolled back afterwards
    (the statement's writes are undone)."""
    with conn.transaction(force_rollback=True):
        conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
        with prepared(conn, query) as run:
            return run(params)


@contextmanager
def prepared(conn: psycopg.Connection[Any], query: str
             ) -> Iterator[Callable[[Mapping[str, Any]], dict[str, Any]]]:
    """``query`` prepared on ``conn`` for as long as the block runs, and a function giving the
    EXPLAIN ANALYZE of one execution with ``params``, each in a transaction rolled back. Its
    plans are the session's (``plan_cache_mode``): a generic one is made at the first run and
    kept until something invalidates it (an ANALYZE of a table it reads, DDL), as a pooled
    connection keeps it."""
    text, name, names = as_prepared(query)
    conn.execute(f"PREPARE {name} AS {text}")
    cur = psycopg.ClientCursor(conn)
    args = ", ".join(["%s"] * len(names))

    def run(params: Mapping[str, Any]) -> dict[str, Any]:
        with conn.transaction(force_rollback=True):
            row = cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({args})",
                              [params[n] for n in names]).fetchone()
        assert row is not None
        return row[0][0]  # type: ignore[no-any-return]

    try:
        yield run
    finally:
        conn.execute(f"DEALLOCATE {name}")
