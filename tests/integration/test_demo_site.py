"""``delayq demo`` refuses, before it creates, purges or starts anything, when another demo runs
on the database or when a table of one of the demo's names is not the demo's own."""

from __future__ import annotations

import psycopg
from click.testing import CliRunner

from delayq_transport import Database
from delayq_transport.cli import main
from delayq_transport.core.ledgers import DEMO_TABLE, DemoSite, RunLog, demo_tables


def _demo(database_url: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["-d", database_url, "demo", "--no-web"])
    return result.exit_code, " ".join(result.output.split())


def _tables(database_url: str) -> set[str]:
    with psycopg.connect(database_url) as conn:
        return {r[0] for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
            "AND relkind = 'r'")}


def test_a_second_demo_is_refused_while_one_runs(database_url: str) -> None:
    with Database(database_url, max_size=1) as db, DemoSite(db) as running:
        running.prepare()
        RunLog(db).record("theirs", 0, "running")
        code, output = _demo(database_url)
        assert code == 1, output
        assert "another `delayq demo` is running on this database" in output
        assert [step[0] for step in RunLog(db).steps()] == ["theirs"]  # nothing reset
    with Database(database_url, max_size=1) as db, DemoSite(db):
        pass  # released with its run: the next demo may claim it


def test_tables_of_the_demos_names_it_did_not_create_are_refused(database_url: str) -> None:
    for name in demo_tables():
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {name} (note text)")
            conn.execute(f"INSERT INTO {name} VALUES ('the user''s')")
        before = _tables(database_url)
        code, output = _demo(database_url)
        assert code == 1, output
        assert f"{name} exist in this database and were not created by `delayq demo`" in output
        assert _tables(database_url) == before
        with psycopg.connect(database_url, autocommit=True) as conn:
            assert conn.execute(f"SELECT note FROM {name}").fetchall() == [("the user's",)]
            conn.execute(f"DROP TABLE {name}")
    assert DEMO_TABLE not in _tables(database_url)


def test_the_demos_own_tables_are_reused(database_url: str) -> None:
    for _ in range(2):
        with Database(database_url, max_size=1) as db, DemoSite(db) as site:
            site.prepare()
            assert RunLog(db).steps() == []  # the previous run's steps are gone
            RunLog(db).record("t", 0, "done")
    assert set(demo_tables()) <= _tables(database_url)
