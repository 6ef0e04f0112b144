"""The one loader of the core's SQL (core/db/queries.py): every part's .sql file is read, each
statement found under its own name, in the part whose code runs it; a name written twice is
refused rather than one block silently shadowing the other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from delayq_transport.core.db import queries

CORE = Path(queries.__file__).resolve().parents[1]
BLOCK = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def test_every_block_of_every_part_is_loaded_once() -> None:
    queries.raw_queries.cache_clear()
    files = sorted(CORE.glob("*/*.sql"))
    assert {f.parent.name for f in files} == set(queries.SQL_PARTS)
    names = [n for f in files for n in BLOCK.findall(f.read_text())]
    assert len(names) == len(set(names)) and set(names) == set(queries.raw_queries())
    assert queries.raw_queries()["try_poll_many"].startswith(("WITH", "UPDATE", "SELECT"))


def test_a_part_runs_the_statements_of_its_own_file() -> None:
    """Each block is named in the code of the part whose file holds it, or of a part above it
    (the lowest part that runs a statement keeps it). Prefixed families (``grant_``,
    ``djbeat_``) are named by their prefix. The loader and the row shapes (db/queries.py,
    db/rows.py) name statements of every part without running them."""
    order = list(queries.SQL_PARTS)
    naming_only = {"queries.py", "rows.py"}
    code = {part: " ".join(p.read_text() for p in (CORE / part).glob("*.py")
                           if not (part == "db" and p.name in naming_only)) for part in order}
    misplaced = []
    for f in sorted(CORE.glob("*/*.sql")):
        part = f.parent.name
        for name in BLOCK.findall(f.read_text()):
            users = [p for p in order if re.search(rf"[\"']{name}[\"']", code[p])
                     or re.search(rf"[\"']{name.split('_')[0]}_[\"']", code[p])
                     or (name.startswith("grant_") and "grant_statements" in code[p]
                         and p == "schema")]
            if users and min(users, key=order.index) != part:
                misplaced.append(f"{name} in {part}/{f.name}, run by {users}")
    assert misplaced == []


def test_a_name_written_twice_is_refused(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = tmp_path / "a.sql", tmp_path / "b.sql"
    one.write_text("-- same --\n-- first.\nSELECT 1\n")
    two.write_text("-- same --\n-- second.\nSELECT 2\n")
    monkeypatch.setattr(queries, "sql_files", lambda: [one, two])
    queries.raw_queries.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="'same' named twice"):
            queries.raw_queries()
    finally:
        monkeypatch.undo()
        queries.raw_queries.cache_clear()
