"""``delayq uninstall``: every object delayq created for one queue table, listed, then dropped.

Only what delayq creates, by exact name: the queue table with its three indexes, triggers and
id sequence, the bindings table, the run ledger, the NOTIFY, revoke and search functions, the
opt-in search index, the demo's run log (when it carries the demo's mark), the table's rows in
the shared tables, and the shared tables themselves (migrations ledger, schedule entries, task
results) once no other queue table is recorded. A table not in the migrations ledger is not
delayq's: refused.
An index or trigger someone else added to these tables would go with them, so uninstall
refuses while one exists and names it. delayq creates no roles; the ``pg_trgm`` extension the
search index may have brought is left in place (other things may use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..db.database import Database
from ..db.errors import DelayqError, ServerTimeout
from ..db.queries import (
    MIGRATIONS_TABLE,
    RESULTS_TABLE,
    Queries,
    control_table_names,
    demo_log_name,
    runs_table_name,
)
from .migrations import (
    ENTRIES_TABLE,
    INSTALLED_TABLE,
    SCHEDULERS_TABLE,
    bindings_table,
    controls_tables,
    queue_table,
    runs_table,
    serialise_schema_work,
)

SHARED_TABLES = (MIGRATIONS_TABLE, ENTRIES_TABLE, INSTALLED_TABLE, SCHEDULERS_TABLE,
                 RESULTS_TABLE)
#: ``relkind`` of the relations uninstall drops: ordinary tables (and their id sequence).
TABLE_KIND = "r"
SEQUENCE_KIND = "S"
#: The queue table's rows are counted exactly up to this many (the dry run stays cheap).
ROW_COUNT_CAP = 100_000


class UninstallRefused(DelayqError):
    """Uninstall would drop something delayq did not create, or the table is not delayq's."""


@dataclass(frozen=True)
class DbObject:
    kind: str
    name: str
    detail: str = ""


@dataclass
class UninstallPlan:
    """What ``delayq uninstall`` drops for one table, what it keeps, and what blocks it."""

    table: str
    drop: list[DbObject] = field(default_factory=list)
    foreign: list[DbObject] = field(default_factory=list)
    other_tables: list[str] = field(default_factory=list)
    demo_log: bool = False
    schedule_tables: bool = False
    schedulers_table: bool = False
    results_table: bool = False
    shared: list[str] = field(default_factory=list)


def _own_index_names(table: str) -> set[str]:
    """Index names delayq's DDL gives the table's relations (primary keys included)."""
    controls = controls_tables(table)
    names = {f"{t}_pkey" for t in (table, f"{table}__bindings", runs_table_name(table),
                                   demo_log_name(table), *(str(c.name) for c in controls))}
    for declared in (queue_table(table), bindings_table(table), runs_table(table), *controls):
        names |= {str(index.name) for index in declared.indexes}
    return names | {f"{table}__search_trgm"}


def plan_uninstall(db: Database, table: str) -> UninstallPlan:
    """List, without changing anything, what uninstalling ``table`` would drop."""
    q = Queries(table)
    plan = UninstallPlan(table)
    own = [table, f"{table}__bindings", runs_table_name(table),
           *control_table_names(table).values(), demo_log_name(table)]
    sequence = f"{table}_id_seq"
    found = {r[0]: r for r in db.fetchall(q["uninstall_relations"],
                                          {"names": [*own, sequence, *SHARED_TABLES]})}
    if MIGRATIONS_TABLE not in found or not db.fetchall(q["migrations_applied"],
                                                        {"table_name": table}):
        raise UninstallRefused(
            f"no delayq queue table {table!r} in this database: the migrations ledger "
            f"({MIGRATIONS_TABLE}) does not record it, so nothing is uninstalled")
    plan.demo_log = bool(found.get(demo_log_name(table), (0, 0, 0, False))[3])
    tables = [n for n in own if n in found and (n != demo_log_name(table) or plan.demo_log)]
    for name in tables:
        _, relkind, rows, _ = found[name]
        if relkind != TABLE_KIND:
            raise UninstallRefused(f"{name} is not a table (relkind {relkind!r}): not delayq's")
        plan.drop.append(DbObject("table", name, f"about {rows:,} rows"))
    if table in tables:
        plan.drop[0] = DbObject("table", table, _queue_rows(db, q))
    plan.drop += _attached(db, q, tables, plan)
    if sequence in found and found[sequence][1] == SEQUENCE_KIND:
        plan.drop.append(DbObject("sequence", sequence, f"owned by {table}, dropped with it"))
    plan.drop += [DbObject("function", f) for (f,) in db.fetchall(q["uninstall_functions"])]
    plan.other_tables = [r[0] for r in db.fetchall(q["uninstall_other_tables"],
                                                   {"table_name": table})]
    plan.schedule_tables = ENTRIES_TABLE in found and INSTALLED_TABLE in found
    plan.drop.append(DbObject("rows", MIGRATIONS_TABLE, f"the ledger rows of {table}"))
    if plan.schedule_tables:
        plan.drop.append(DbObject("rows", f"{ENTRIES_TABLE}, {INSTALLED_TABLE}",
                                  f"the schedule entries of {table}"))
    plan.schedulers_table = SCHEDULERS_TABLE in found
    if plan.schedulers_table:
        plan.drop.append(DbObject("rows", SCHEDULERS_TABLE,
                                  f"the schedulers' heartbeats of {table}"))
    plan.results_table = RESULTS_TABLE in found
    if plan.results_table:
        plan.drop.append(DbObject("rows", RESULTS_TABLE, f"the task results of {table}"))
    if not plan.other_tables:
        plan.shared = [n for n in SHARED_TABLES if n in found]
        plan.drop += [DbObject("table", n, "shared; no other queue table left")
                      for n in plan.shared]
    return plan


def _queue_rows(db: Database, q: Queries) -> str:
    row = db.fetchone(q["uninstall_queue_rows"], {"cap": ROW_COUNT_CAP + 1})
    count = int(row[0]) if row else 0
    shown = f"more than {ROW_COUNT_CAP:,}" if count > ROW_COUNT_CAP else f"{count:,}"
    return f"{shown} tasks (waiting or in flight): dropped with it"


def _attached(db: Database, q: Queries, tables: list[str],
              plan: UninstallPlan) -> list[DbObject]:
    """Indexes and triggers on the tables: delayq's are listed, anyone else's block."""
    own_indexes = _own_index_names(plan.table)
    own_triggers = {f"{plan.table}__notify_insert", f"{plan.table}__notify_update"}
    listed: list[DbObject] = []
    for kind, name, on_table in db.fetchall(q["uninstall_attached"], {"tables": tables}):
        mine = name in (own_indexes if kind == "index" else own_triggers)
        item = DbObject(kind, name, f"on {on_table}, dropped with it")
        (listed if mine else plan.foreign).append(item)
    return listed


def uninstall(db: Database, table: str, *, lock_timeout: str = "5s") -> UninstallPlan:
    """Drop what :func:`plan_uninstall` lists, in one transaction (all or nothing), waiting
    at most ``lock_timeout`` for each table lock (sessions using the tables hold them)."""
    plan = plan_uninstall(db, table)
    if plan.foreign:
        names = ", ".join(f"{o.kind} {o.name} ({o.detail.split(',')[0]})" for o in plan.foreign)
        raise UninstallRefused(
            f"not uninstalling {table}: {names} were not created by delayq and would be dropped "
            "with its tables; drop or move them first")
    q = Queries(table)

    def work(conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            serialise_schema_work(conn, q, lock_timeout=lock_timeout)
            conn.execute(q["uninstall_drop_tables"])
            if plan.demo_log:
                conn.execute(q["uninstall_drop_demo_log"])
            conn.execute(q["uninstall_drop_functions"])
            conn.execute(q["uninstall_forget_ledger"], {"table_name": table})
            if plan.schedule_tables:
                conn.execute(q["uninstall_forget_schedule"], {"table_name": table})
            if plan.schedulers_table:
                conn.execute(q["uninstall_forget_schedulers"], {"table_name": table})
            if plan.results_table:
                conn.execute(q["uninstall_forget_task_results"], {"table_name": table})
            if plan.shared:
                conn.execute(q["uninstall_drop_shared"])

    try:
        db.run(work, idempotent=False)
    except ServerTimeout as exc:
        raise UninstallRefused(
            f"could not lock the tables of {table} within {lock_timeout} ({exc}): sessions "
            "are using them (workers, producers, beat, web); stop them first") from exc
    return plan
