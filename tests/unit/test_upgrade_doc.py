"""docs/how-to/upgrade.md lists every migration with the lock and rewrite its code declares
(``Migration.lock``/``rewrites``, themselves checked against PostgreSQL by
tests/integration/test_migration_locks.py), so the page cannot drift from the code."""

from __future__ import annotations

from pathlib import Path

from delayq_transport.core.schema import LOCK_BLOCKS, MIGRATIONS, Migration

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "upgrade.md"


def migration_table() -> str:
    rows = ["| migration | what | lock | keeps waiting while held | rewrites the table |",
            "| --- | --- | --- | --- | --- |"]
    rows += [f"| {m.version} | {m.description} | {_lock(m)} | {LOCK_BLOCKS[m.lock]} | "
             f"{'yes' if m.rewrites else 'no'} |" for m in MIGRATIONS]
    return "\n".join(rows)


def _lock(m: Migration) -> str:
    return m.lock if m.lock == "none" else f"{m.lock} on {m.lock_on}"


def test_upgrade_page_lists_every_migration_as_the_code_declares_it() -> None:
    text = PAGE.read_text()
    start = text.index("<!-- migrations:start")
    body = text[text.index("\n", start) + 1:text.index("<!-- migrations:end -->")].strip()
    assert body == migration_table(), f"replace the table in {PAGE} with:\n{migration_table()}"


def test_the_workers_wait_is_described_with_the_codes_figures() -> None:
    """'A worker before `delayq migrate`' quotes the wait's default, how often it looks and how
    often it says so: the constants of core/schema (a changed default fails here)."""
    from delayq_transport.core.schema.migrations import (
        DEFAULT_SCHEMA_WAIT_S,
        SCHEMA_CHECK_S,
        SCHEMA_SAY_S,
    )
    text = " ".join(PAGE.read_text().split())
    assert SCHEMA_CHECK_S == 1.0 and "it looks every second" in text
    assert f"logs one line every {SCHEMA_SAY_S:g} s" in text
    assert f"after `schema_wait` ({DEFAULT_SCHEMA_WAIT_S:g} s, 0: no wait" in text
