"""Shared by the plan tests: a named statement rewritten for ``PREPARE``."""

from __future__ import annotations

import uuid

from delayq_transport.core.db.direct import DirectStatement


def as_prepared(query: str) -> tuple[str, str, list[str]]:
    """``query`` with its ``%(name)s`` parameters turned into ``$n`` (each name once, in order
    of first use), a fresh statement name, and the parameter names in ``$n`` order: the form
    delayq's hot statements are prepared in (core/db/direct.py)."""
    statement = DirectStatement("plan", query)
    return statement.sql.decode(), f"p_{uuid.uuid4().hex[:8]}", list(statement.names)
