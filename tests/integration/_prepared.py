"""Shared by the plan tests: a named statement rewritten for ``PREPARE``."""

from __future__ import annotations

import re
import uuid


def as_prepared(query: str) -> tuple[str, str, list[str]]:
    """``query`` with its ``%(name)s`` parameters turned into ``$n`` (each name once, in order
    of first use), a fresh statement name, and the parameter names in ``$n`` order."""
    names: list[str] = []

    def placeholder(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)[sb]", placeholder, query)
    return prepared, f"p_{uuid.uuid4().hex[:8]}", names
