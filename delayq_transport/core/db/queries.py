"""The one loader of the core's SQL: the named statements of every part's ``.sql`` files,
bound to one table.

Each part of the core keeps the statements it runs in a ``.sql`` file of its own folder
(``queue/queue.sql``, ``schema/schema.sql``, ``inspect/inspect.sql``, ``ledgers/ledgers.sql``,
``integrations/<integration>.sql``, ``db/db.sql``): named blocks, a name used once across all of
them. The files are read once; :class:`Queries` formats every statement for a validated table
name so the hot path only looks statements up in a dict.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable

from psycopg import sql

from .direct import DirectStatement
from .errors import InvalidInput
from .rows import row_maker

TABLE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,30}$")
MIGRATIONS_TABLE = "delayq_migrations"
#: Django task framework results, one table shared by every queue table (core/ledgers).
RESULTS_TABLE = "delayq_task_results"
#: Blocks rendered per role by :func:`grant_statements`, not per table at start-up.
GRANT_PREFIX = "grant_"
#: Blocks that also name the table's schema, rendered by :func:`schema_statements` when used.
SCHEMA_PREFIX = "schema_"
#: Blocks on django-celery-beat's tables, rendered for their schema by
#: core/integrations/djbeat.py.
DJBEAT_PREFIX = "djbeat_"
#: Blocks that are not statements on a queue table (Queries leaves them out).
NOT_PER_TABLE = (GRANT_PREFIX, SCHEMA_PREFIX, DJBEAT_PREFIX)
_BLOCK_RE = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)
#: psycopg 3's binary placeholder, which psycopg2 and client-side binding do not know.
_BINARY_PLACEHOLDER = re.compile(r"%\((\w+)\)b")

#: The comment on every table ``delayq demo`` created (core/ledgers/demo_tables.py): only a table
#: carrying it is the demo's own.
DEMO_MARK = "created by `delayq demo`; `delayq --table delayq_demo uninstall` lists what it made"

#: Expands ``{now}``: the injected clock if the queue has one, else the database clock in whole
#: milliseconds, rounded down: a cast alone rounds to the nearest, and a row due at T was taken
#: up to half a millisecond before T (a Dramatiq countdown's ETA is whole milliseconds).
NOW_SQL = "COALESCE(%(now)s::bigint, floor(extract(epoch FROM now()) * 1000)::bigint)"


#: The core's parts that hold statements, each in ``.sql`` files of its own folder.
SQL_PARTS = ("db", "schema", "queue", "inspect", "ledgers", "integrations")


def sql_files() -> list[Traversable]:
    """Every ``.sql`` file of the core's parts, in the order of :data:`SQL_PARTS`."""
    return [f for part in SQL_PARTS
            for f in sorted(files(f"delayq_transport.core.{part}").iterdir(), key=str)
            if f.name.endswith(".sql")]


@cache
def raw_queries() -> dict[str, str]:
    """Named blocks of every part's .sql files: name -> SQL text with its leading comment
    lines removed. A name found twice is refused (a block would silently shadow another)."""
    blocks: dict[str, str] = {}
    for sql_file in sql_files():
        parts = _BLOCK_RE.split(sql_file.read_text())
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in blocks:
                raise RuntimeError(f"statement {name!r} named twice ({sql_file.name})")
            lines = [ln for ln in body.strip().splitlines() if not ln.startswith("-- ")]
            blocks[name] = "\n".join(lines).strip()
    return blocks


def validate_table_name(name: str) -> str:
    """Table names become identifiers (and index/trigger names), so only a safe subset passes."""
    if not isinstance(name, str) or not TABLE_NAME_RE.match(name):
        raise InvalidInput(
            f"invalid table name {name!r}: use 1-31 letters, digits or underscores, "
            "not starting with a digit"
        )
    return name


def revoke_function_name(table: str) -> str:
    """The table's SECURITY DEFINER revoke function (migration 13)."""
    return f"{table}__revoke_waiting"


def claim_function_name(table: str) -> str:
    """The claim of a controlled queue (migration 21, core/queue/controls.py)."""
    return f"{table}__claim_controlled"


def control_table_names(table: str) -> dict[str, str]:
    """Migration 21's tables by the identifier the .sql files name them with."""
    return {"controls": f"{table}__controls", "control_slots": f"{table}__control_slots",
            "control_keys": f"{table}__control_keys"}


def demo_log_name(table: str) -> str:
    """The run log ``delayq demo`` keeps next to its queue table (core/ledgers/demo_tables.py)."""
    return f"{table}__log"


def runs_table_name(table: str) -> str:
    """The run ledger of a queue table (core/ledgers/runs.py)."""
    return f"{table}__runs"


def notify_channel(table: str) -> str:
    return f"delayq_{table}"


class Queries:
    """Every statement of the core's .sql files, formatted for one table."""

    def __init__(self, table: str) -> None:
        self.table = validate_table_name(table)
        channel = notify_channel(table)
        idents = {
            "table": sql.Identifier(table),
            "migrations": sql.Identifier(MIGRATIONS_TABLE),
            "bindings": sql.Identifier(f"{table}__bindings"),
            "runs": sql.Identifier(runs_table_name(table)),
            "stage": sql.Identifier(f"{table}__stage"),
            "notify_fn": sql.Identifier(f"{table}__notify"),
            "insert_trigger": sql.Identifier(f"{table}__notify_insert"),
            "update_trigger": sql.Identifier(f"{table}__notify_update"),
            "search_fn": sql.Identifier(f"{table}__search_text"),
            "revoke_fn": sql.Identifier(revoke_function_name(table)),
            "claim_fn": sql.Identifier(claim_function_name(table)),
            **{k: sql.Identifier(v) for k, v in control_table_names(table).items()},
            "demo_log": sql.Identifier(demo_log_name(table)),
            "demo_mark": sql.Literal(DEMO_MARK),
            "search_index": sql.Identifier(f"{table}__search_trgm"),
            "search_index_literal": sql.Literal(sql.Identifier(f"{table}__search_trgm")
                                                .as_string(None)),
            # Quoted function names as strings, for to_regprocedure() in catalog queries.
            **{f"{key}_literal": sql.Literal(sql.Identifier(name).as_string(None))
               for key, name in (("notify_fn", f"{table}__notify"),
                                 ("revoke_fn", revoke_function_name(table)),
                                 ("claim_fn", claim_function_name(table)),
                                 ("search_fn", f"{table}__search_text"))},
            "channel": sql.Identifier(channel),
            "channel_literal": sql.Literal(channel),
            # The quoted name as a string, for to_regclass() in catalog queries.
            "table_literal": sql.Literal(sql.Identifier(table).as_string(None)),
            "migrations_literal": sql.Literal(sql.Identifier(MIGRATIONS_TABLE).as_string(None)),
            "now": sql.SQL(NOW_SQL),
        }
        # Rendered to plain strings once: psycopg keys its prepared statements on the text.
        self._text = {
            name: sql.SQL(text).format(**idents).as_string(None)
            for name, text in raw_queries().items()
            if not name.startswith(NOT_PER_TABLE)
        }
        self._direct: dict[str, DirectStatement] = {}
        self._portable: dict[tuple[str, ...], str] = {}

    def __getitem__(self, name: str) -> str:
        return self._text[name]

    def direct(self, name: str) -> DirectStatement:
        """The statement run on libpq itself (core/db/direct.py), made once per table."""
        statement = self._direct.get(name)
        if statement is None:
            statement = self._direct[name] = DirectStatement(
                name, self._text[name], row_maker(name))
        return statement


    def portable(self, *names: str) -> str:
        """Statements for a connection delayq does not own (core/queue/joined.py): ``%(x)s``
        placeholders only, which psycopg2 and psycopg 3's client-side binding both fill in
        (binary ``%(x)b`` is psycopg 3's server-side binding alone), several statements joined
        into one text sent in one round trip. The statements are the same named blocks."""
        text = self._portable.get(names)
        if text is None:
            text = self._portable[names] = ";\n".join(
                _BINARY_PLACEHOLDER.sub(r"%(\1)s", self._text[n]) for n in names)
        return text


def grant_statements(block: str, *, table: str, role: str, schema: str) -> list[str]:
    """The GRANT statements of one ``grant_*`` block for a role, identifiers quoted."""
    return schema_statements(GRANT_PREFIX + block, table=table, schema=schema, role=role)


def schema_statements(block: str, *, table: str, schema: str,
                      role: str | None = None) -> list[str]:
    """The statements of a block that names the table's schema (and a role), quoted."""
    validate_table_name(table)
    names = {"schema": schema} if role is None else {"role": role, "schema": schema}
    for what, name in names.items():
        if not isinstance(name, str) or not name or len(name) > 63 or "\x00" in name:
            raise InvalidInput(f"invalid {what} name {name!r}: 1-63 characters, no NUL")
    idents = {
        "table": sql.Identifier(table),
        "bindings": sql.Identifier(f"{table}__bindings"),
        "runs": sql.Identifier(runs_table_name(table)),
        "sequence": sql.Identifier(f"{table}_id_seq"),
        "migrations": sql.Identifier(MIGRATIONS_TABLE),
        "revoke_fn": sql.Identifier(revoke_function_name(table)),
        **{k: sql.Identifier(v) for k, v in control_table_names(table).items()},
        "schema": sql.Identifier(schema),
    }
    if role is not None:
        idents["role"] = sql.Identifier(role)
    text = sql.SQL(raw_queries()[block]).format(**idents).as_string(None)
    return [s.strip() + ";" for s in text.split(";\n") if s.strip()]
