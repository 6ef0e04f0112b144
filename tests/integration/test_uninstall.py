"""``delayq uninstall`` drops every object delayq created for a table and nothing else: the
user's own tables, one named like delayq's, another queue table's objects and the objects the
shared tables still serve all stay; an index or trigger of the user's on delayq's tables, a
view on them or a table the ledger does not know makes it refuse with nothing dropped."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from delayq_transport import Database, DelayedQueue
from delayq_transport.cli import main
from delayq_transport.core import DatabaseError
from delayq_transport.core.inspect import search
from delayq_transport.core.ledgers import DEMO_TABLE, DemoSite, demo_tables
from delayq_transport.core.schema import UninstallRefused, plan_uninstall, uninstall

USER_DDL = (
    "CREATE TABLE orders (id int PRIMARY KEY, note text)",
    "INSERT INTO orders VALUES (1, 'keep me')",
    "CREATE TABLE delayed_queue_archive (LIKE delayed_queue)",  # a similar name
    "INSERT INTO delayed_queue_archive SELECT * FROM delayed_queue",
    "CREATE FUNCTION delayed_queue__notify_me() RETURNS int LANGUAGE sql AS 'SELECT 1'",
)


def _catalog(url: str) -> set[tuple[str, str]]:
    """Every relation, function (an extension's aside) and trigger of the public schema, and
    the extensions, by kind and name."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("""
            SELECT 'rel:' || relkind::text, relname::text FROM pg_class
            WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'i', 'S', 'v')
            UNION ALL SELECT 'function', p.oid::regprocedure::text FROM pg_proc AS p
            WHERE p.pronamespace = 'public'::regnamespace AND NOT EXISTS (
                SELECT 1 FROM pg_depend AS d WHERE d.objid = p.oid AND d.deptype = 'e')
            UNION ALL SELECT 'trigger', tgname::text FROM pg_trigger WHERE NOT tgisinternal
            UNION ALL SELECT 'extension', extname::text FROM pg_extension""").fetchall()
    return {(kind, name) for kind, name in rows}


def _ledger(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute('SELECT DISTINCT "tableName" FROM delayq_migrations')}


def test_uninstall_drops_delayqs_objects_only(database_url: str) -> None:
    with DelayedQueue(database_url, kind="celery") as queue, \
            DelayedQueue(database_url, table="other_q", kind="celery") as other:
        queue.offer("task", b"x", queue.now() + timedelta(hours=1))
        other.offer("theirs", b"y", other.now() + timedelta(hours=1))
        search.create_index(queue)  # the opt-in search index and its function
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in USER_DDL:
            conn.execute(statement)
    before = _catalog(database_url)
    with Database(database_url, max_size=1) as db:
        planned = {o.name for o in plan_uninstall(db, "delayed_queue").drop}
        assert {"delayed_queue", "delayed_queue__search_trgm",
                "delayed_queue__revoke_waiting(text[])"} <= planned
        assert "delayq_migrations" in planned  # its rows only: other_q still uses it
        uninstall(db, "delayed_queue")
    gone = before - _catalog(database_url)
    assert {name for _, name in gone} <= planned
    assert {name.split("(")[0] for _, name in gone} >= {
        "delayed_queue", "delayed_queue__bindings", "delayed_queue__runs", "delayed_queue_pkey",
        "delayed_queue_id_seq", "delayed_queue__notify_insert", "delayed_queue__notify",
        "delayed_queue__revoke_waiting", "delayed_queue__search_text"}
    assert not {n for _, n in gone if n.startswith(("other_q", "delayq_", "orders"))}
    assert ("extension", "pg_trgm") not in gone
    assert _ledger(database_url) == {"other_q"}
    with DelayedQueue(database_url, table="other_q", kind="celery") as other:
        assert other.get("theirs") is not None
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT note FROM orders").fetchall() == [("keep me",)]
        assert conn.execute("SELECT count(*) FROM delayed_queue_archive").fetchone() == (1,)
    with Database(database_url, max_size=1) as db:  # the last queue table takes the shared ones
        uninstall(db, "other_q")
    users = {"orders", "orders_pkey", "delayed_queue_archive", "delayed_queue__notify_me()"}
    assert _catalog(database_url) == {(kind, name) for kind, name in before
                                      if name in users or kind == "extension"}


def test_dry_run_by_default_and_the_demos_tables(database_url: str) -> None:
    with Database(database_url, max_size=1) as db, DemoSite(db) as site:
        site.prepare()
    before = _catalog(database_url)
    result = CliRunner().invoke(main, ["-d", database_url, "--table", DEMO_TABLE, "uninstall"])
    assert result.exit_code == 0, result.output
    text = "".join(result.output.split())
    assert all(name in text for name in demo_tables()) and "dryrun" in text
    assert _catalog(database_url) == before
    result = CliRunner().invoke(main, ["-d", database_url, "--table", DEMO_TABLE, "uninstall",
                                       "--yes"])
    assert result.exit_code == 0, result.output
    names = {name for _, name in _catalog(database_url)}
    assert not set(demo_tables()) & names
    assert "delayed_queue" in names and _ledger(database_url) == {"delayed_queue"}


@pytest.mark.parametrize("obstacle", [
    "CREATE INDEX my_index ON delayed_queue (\"createdAt\")",
    "CREATE FUNCTION my_audit() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';"
    "CREATE TRIGGER my_audit AFTER DELETE ON delayed_queue__bindings "
    "FOR EACH ROW EXECUTE FUNCTION my_audit()",
])
def test_objects_of_the_users_on_delayqs_tables_block_it(database_url: str,
                                                         obstacle: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(obstacle)
    before = _catalog(database_url)
    result = CliRunner().invoke(main, ["-d", database_url, "uninstall", "--yes"])
    assert result.exit_code == 1 and "not created by delayq" in result.output, result.output
    assert "my_" in result.output
    assert _catalog(database_url) == before


def test_a_view_on_the_queue_or_an_unknown_table_drops_nothing(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute('CREATE VIEW waiting AS SELECT "pKey" FROM delayed_queue')
    before = _catalog(database_url)
    with Database(database_url, max_size=1) as db:
        with pytest.raises(DatabaseError, match="depend"):
            uninstall(db, "delayed_queue")
        assert _catalog(database_url) == before  # one transaction: nothing half-dropped
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE jobs (id int)")
        with pytest.raises(UninstallRefused, match="does not record it"):
            plan_uninstall(db, "jobs")


def test_a_session_using_the_table_makes_it_wait_then_give_up(database_url: str) -> None:
    with psycopg.connect(database_url) as busy, Database(database_url, max_size=1) as db:
        busy.execute("SELECT count(*) FROM delayed_queue")  # holds ACCESS SHARE until commit
        with pytest.raises(UninstallRefused, match="stop them first"):
            uninstall(db, "delayed_queue", lock_timeout="200ms")
        busy.rollback()
    assert ("rel:r", "delayed_queue") in _catalog(database_url)


def test_the_uninstall_page_names_every_object_uninstall_drops(database_url: str) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "uninstall.md").read_text()
    with DelayedQueue(database_url, kind="celery") as queue:
        search.create_index(queue)
    with Database(database_url, max_size=1) as db:
        with DemoSite(db) as site:
            site.prepare()
        for table in ("delayed_queue", DEMO_TABLE):
            plan = plan_uninstall(db, table)
            names = {n for o in plan.drop for n in o.name.split(", ")}
            missing = {n.replace(table, "<table>") for n in names} - {
                n for n in {n.replace(table, "<table>") for n in names} if f"`{n}`" in page}
            assert missing == set(), f"docs/how-to/uninstall.md does not name {missing}"
