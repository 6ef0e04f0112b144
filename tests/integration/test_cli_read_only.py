"""The CLI in a log and on a database it must not change (issue 42, section 4 and section 2
item 1): commands that read never run DDL, a failure is one line on stderr with the documented
exit status (docs/reference/cli.md), and tables off a terminal keep one line per row."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from _pg_roles import role_url
from click.testing import CliRunner, Result
from conftest import create_database, drop_database

from delayq_transport import DelayedQueue
from delayq_transport.cli import main
from delayq_transport.cli.errors import EXIT_NO_SCHEMA, EXIT_UNAVAILABLE
from delayq_transport.formats.celery import encode, kind_for, task_message

#: Every command that reads (``--serve`` and ``web`` refuse before they serve).
READ_ONLY = [
    ["status"], ["status", "--json"], ["beat", "list"], ["beat", "list", "--json"],
    ["tasks", "list"], ["tasks", "list", "--json"], ["tasks", "show", "some-id"],
    ["tasks", "search-index", "status"], ["tasks", "dead-letters", "list"],
    ["metrics"], ["metrics", "--serve", "--port", "0"], ["web", "--port", "0"],
]

#: Relations of every non-system schema: what a command that created tables would add.
RELATIONS = ("SELECT count(*) FROM pg_class AS c JOIN pg_namespace AS n "
             "ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', "
             "'information_schema') AND n.nspname NOT LIKE 'pg_toast%'")


@pytest.fixture
def empty_db() -> Iterator[tuple[str, str]]:
    """A database without delayq's tables (not the migrated template): (name, URL)."""
    name = f"delayq_empty_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    try:
        yield name, url
    finally:
        drop_database(name)


def relations(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(RELATIONS).fetchone()
        assert row is not None
        return int(row[0])


def assert_refused(result: Result, dbname: str) -> None:
    """Exit 3, the one line on stderr naming the database and the command to run, no stdout."""
    assert result.exit_code == EXIT_NO_SCHEMA, (result.exit_code, result.output)
    assert result.stderr == (
        f"error: no delayq tables in database {dbname!r}: run `delayq migrate`\n")
    assert result.stdout == ""


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_a_read_only_command_on_a_database_without_the_tables_creates_nothing(
        empty_db: tuple[str, str], args: list[str]) -> None:
    name, url = empty_db
    before = relations(url)
    result = CliRunner().invoke(main, ["-d", url, *args])
    assert_refused(result, name)
    assert relations(url) == before == 0


def test_a_role_without_create_rights_gets_the_same_line(empty_db: tuple[str, str]) -> None:
    name, url = empty_db
    role = f"dq_nocreate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{role}"')
    try:
        for args in (["status"], ["beat", "list"]):
            assert_refused(CliRunner().invoke(main, ["-d", role_url(url, role), *args]), name)
        assert relations(url) == 0
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE usename = %s", (role,))
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


def test_another_table_is_named_with_the_command_that_creates_it(database_url: str) -> None:
    before = relations(database_url)
    result = CliRunner().invoke(main, ["-d", database_url, "--table", "other_q", "tasks",
                                       "list"])
    assert result.exit_code == EXIT_NO_SCHEMA, result.output
    assert "no delayq tables for table 'other_q' in database " in result.stderr
    assert result.stderr.endswith(": run `delayq --table other_q migrate`\n")
    assert relations(database_url) == before


def test_migrate_is_the_command_that_creates_them(empty_db: tuple[str, str]) -> None:
    name, url = empty_db
    assert CliRunner().invoke(main, ["-d", url, "migrate"]).exit_code == 0
    assert relations(url) > 0
    result = CliRunner().invoke(main, ["-d", url, "status", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["queues"] == []


def test_an_unreachable_database_is_one_line_on_stderr_and_exit_4(
        empty_db: tuple[str, str]) -> None:
    name, url = empty_db
    missing = url.replace(name, name + "_gone")
    result = CliRunner().invoke(main, ["-d", missing, "status"])
    assert result.exit_code == EXIT_UNAVAILABLE
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: database "), result.stderr
    assert f'database "{name}_gone" does not exist' in lines[0]


def test_tables_off_a_terminal_keep_one_line_per_row(database_url: str) -> None:
    """CliRunner's stdout is no terminal, like CI or `> file`: a long task id and task name
    stay whole on the row's one line, whatever the terminal width was."""
    task_id = "order-" + "7" * 90
    task = "shop.billing." + "very_long_task_name_" * 8
    at = datetime.now(UTC) + timedelta(hours=1)
    with DelayedQueue(database_url, kind="celery") as q:
        msg = task_message(task, ["x" * 50], {}, eta=at, queue="celery", task_id=task_id)
        q.with_kind(kind_for("celery", 0)).offer(task_id, encode(msg), at)
    for env in ({"COLUMNS": "60"}, {"COLUMNS": "60", "FORCE_COLOR": "1"}):  # colours in CI
        result = CliRunner().invoke(main, ["-d", database_url, "tasks", "list"], env=env)
        assert result.exit_code == 0, result.output
        rows = [line for line in result.stdout.splitlines() if task_id in line]
        assert len(rows) == 1 and task in rows[0], (env, result.stdout)
    listed = CliRunner().invoke(main, ["-d", database_url, "tasks", "list", "--json"])
    assert [t["key"] for t in json.loads(listed.stdout)["tasks"]] == [task_id]
    index = CliRunner().invoke(main, ["-d", database_url, "tasks", "search-index", "status",
                                      "--json"])
    assert json.loads(index.stdout) == {"table": "delayed_queue", "search_index": False}
