"""Shared by the plan tests: a named statement rewritten for ``PREPARE``, and its plan."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
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
    prepared, name, names = as_prepared(query)
    with conn.transaction(force_rollback=True):
        conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
        conn.execute(f"PREPARE {name} AS {prepared}")
        cur = psycopg.ClientCursor(conn)
        args = ", ".join(["%s"] * len(names))
        row = cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({args})",
                          [params[n] for n in names]).fetchone()
        conn.execute(f"DEALLOCATE {name}")
    assert row is not None
    return row[0][0]  # type: ignore[no-any-return]
