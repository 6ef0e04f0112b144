"""The declared schema (SQLAlchemy Core) and the numbered migrations that build it.

The table's columns and three indexes are the data model of docs/explanation/design.md, which
explains each. Every change is a new numbered migration; ``migrate()`` applies the
missing ones under a transaction-scoped advisory lock, so many workers starting at once are safe.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import psycopg

from ..db.database import Database
from ..db.errors import PermissionDenied, SchemaMissing
from ..db.queries import (
    MIGRATIONS_TABLE,
    Queries,
    runs_table_name,
    schema_statements,
    validate_table_name,
)

if TYPE_CHECKING:  # SQLAlchemy is imported when a table is declared: `delayq status` and
    # workers whose schema is current never need it (it was ~0.2-0.6 s of every CLI start).
    from sqlalchemy import MetaData, Table

log = logging.getLogger(__name__)


@cache
def _dialect() -> Any:
    from sqlalchemy.dialects import postgresql

    return postgresql.dialect()


def queue_table(name: str, metadata: MetaData | None = None) -> Table:
    """The ``delayed_queue`` table (docs/explanation/design.md) under a (validated)
    configurable name."""
    from sqlalchemy import BigInteger, Column, Index, LargeBinary, MetaData, String, Table

    validate_table_name(name)
    table = Table(
        name,
        metadata or MetaData(),
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("pKey", String(200), nullable=False),
        Column("pKind", String(100), nullable=False),
        Column("payload", LargeBinary, nullable=False),
        Column("scheduledAt", BigInteger, nullable=False),
        Column("scheduledAtInitially", BigInteger, nullable=False),
        Column("lockUuid", String(36), nullable=True),
        Column("createdAt", BigInteger, nullable=False),
    )
    Index(f"{name}__PKeyPlusKindUniqueIndex", table.c.pKey, table.c.pKind, unique=True)
    Index(f"{name}__KindPlusScheduledAtIndex", table.c.pKind, table.c.scheduledAt)
    Index(f"{name}__LockUuidPlusIdIndex", table.c.lockUuid, table.c.id)
    return table


def bindings_table(queue_table_name: str, metadata: MetaData | None = None) -> Table:
    """Exchange bindings shared by every process, so routing does not depend on who declared."""
    from sqlalchemy import BigInteger, Boolean, Column, Index, MetaData, String, Table

    table = Table(
        f"{queue_table_name}__bindings",
        metadata or MetaData(),
        Column("exchange", String(255), primary_key=True),
        Column("routingKey", String(255), primary_key=True),
        Column("queue", String(255), primary_key=True),
        Column("pattern", String(255), nullable=False, server_default=""),
        Column("exchangeType", String(16), nullable=False, server_default="direct"),
        Column("autoDelete", Boolean, nullable=False, server_default="false"),
        Column("seenAt", BigInteger, nullable=False),
    )
    Index(f"{queue_table_name}__bindings_by_queue", table.c.queue)
    return table


def runs_table(queue_table_name: str, metadata: MetaData | None = None) -> Table:
    """The run ledger (core/ledgers/runs.py): one row per applied part of a run (part -1: the whole
    run), written in the transaction of the part's rows; pruned by ``appliedAt`` (retention)."""
    from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, String, Table

    table = Table(
        runs_table_name(queue_table_name),
        metadata or MetaData(),
        Column("runId", String(200), primary_key=True),
        Column("part", Integer, primary_key=True, autoincrement=False),
        Column("rows", BigInteger, nullable=False),
        Column("fingerprint", BigInteger, nullable=False),
        Column("appliedAt", BigInteger, nullable=False),
    )
    Index(f"{queue_table_name}__runs_by_applied_at", table.c.appliedAt)
    return table


def ddl(table: Table) -> list[str]:
    """CREATE TABLE / CREATE INDEX statements for ``table``, idempotent."""
    from sqlalchemy.schema import CreateIndex, CreateTable

    statements = [str(CreateTable(table, if_not_exists=True).compile(dialect=_dialect()))]
    statements += [
        str(CreateIndex(index, if_not_exists=True).compile(dialect=_dialect()))
        for index in sorted(table.indexes, key=lambda i: str(i.name))
    ]
    return statements


#: PostgreSQL's table lock modes, weakest first; "none": no lock on any table that existed
#: before the migration (it only creates objects).
LOCK_MODES = ("none", "ACCESS SHARE", "ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE",
              "SHARE", "SHARE ROW EXCLUSIVE", "EXCLUSIVE", "ACCESS EXCLUSIVE")
#: What a migration holding each lock keeps waiting until it commits (docs/how-to/upgrade.md).
LOCK_BLOCKS = {
    "none": "nothing",
    "ROW EXCLUSIVE": "nothing delayq runs (only DDL that takes SHARE or stronger)",
    "SHARE UPDATE EXCLUSIVE": "no reads or writes; VACUUM, ANALYZE and other schema changes wait",
    "SHARE": "writes (inserts, updates, deletes); reads go on",
    "SHARE ROW EXCLUSIVE": "publishes, polls, acks and lease updates; reads go on",
    "ACCESS EXCLUSIVE": "everything on the table, reads included",
}


@dataclass(frozen=True)
class Migration:
    """One numbered schema change, with what an operator needs to plan it (docs/how-to/
    upgrade.md is checked against these fields; tests/integration/test_migration_locks.py
    checks ``lock`` and ``rewrites`` against PostgreSQL itself)."""

    version: int
    description: str
    apply: Callable[[psycopg.Connection[Any], Queries], None]
    #: The strongest lock taken on a table that existed before it (one of LOCK_MODES), held
    #: until the migration's transaction commits.
    lock: str
    #: Whether it rewrites the queue table (a new copy of every row: time and disk grow with
    #: the table, under its lock).
    rewrites: bool = False
    #: The table that ``lock`` is on, when it is not the queue table (two: ``"a and b"``).
    lock_on: str = "the queue table"

    def __post_init__(self) -> None:
        if self.lock not in LOCK_BLOCKS:
            raise ValueError(f"migration {self.version}: unknown lock {self.lock!r}")


def _create_queue_table(conn: psycopg.Connection[Any], q: Queries) -> None:
    for statement in ddl(queue_table(q.table)):
        conn.execute(statement)


def _create_notify_triggers(conn: psycopg.Connection[Any], q: Queries) -> None:
    conn.execute(q["notify_function"])
    conn.execute(q["notify_triggers"])


def _complete_notify_function(conn: psycopg.Connection[Any], q: Queries) -> None:
    conn.execute(q["notify_function_complete"])


def _create_bindings_table(conn: psycopg.Connection[Any], q: Queries) -> None:
    for statement in ddl(bindings_table(q.table)):
        conn.execute(statement)


def _skip_notify_of_self_notifying_inserts(conn: psycopg.Connection[Any], q: Queries) -> None:
    conn.execute(q["notify_insert_trigger_skip"])


def _queue_autovacuum(conn: psycopg.Connection[Any], q: Queries) -> None:
    conn.execute(q["queue_autovacuum"])


def _queue_fillfactor(conn: psycopg.Connection[Any], q: Queries) -> None:
    conn.execute(q["queue_fillfactor"])


def _create_runs_table(conn: psycopg.Connection[Any], q: Queries) -> None:
    for statement in ddl(runs_table(q.table)):
        conn.execute(statement)


#: The scheduling engine's tables (core/integrations/periodic.py holds their statements):
#: DB-backed entries and the ledger of installed entries, shared by every queue table and keyed
#: by ``tableName``. Celery beat and Dramatiq's periodic actors keep their rows in them alike.
ENTRIES_TABLE = "delayq_schedule_entries"
INSTALLED_TABLE = "delayq_schedule_installed"
#: Their names from migration 10 until migration 16 renamed them: released migrations (10, 12)
#: still create and alter these, and 16 renames them.
LEGACY_ENTRIES_TABLE = "delayq_beat_entries"
LEGACY_INSTALLED_TABLE = "delayq_beat_installed"


def periodic_tables(metadata: MetaData | None = None, *,
                    names: tuple[str, str] = (ENTRIES_TABLE, INSTALLED_TABLE)) -> list[Table]:
    """The scheduling engine's two tables, as migration 10 declared them (migration 12 adds
    ``firstInstalledAt`` to the ledger), under ``names`` (entries, installed)."""
    from sqlalchemy import BigInteger, Boolean, Column, MetaData, String, Table, Text
    from sqlalchemy.dialects.postgresql import JSONB

    metadata = metadata or MetaData()
    entries = Table(
        names[0], metadata,
        Column("tableName", String(31), primary_key=True),
        Column("name", Text, primary_key=True),
        Column("definition", JSONB, nullable=True),
        Column("enabled", Boolean, nullable=False, server_default="true"),
        Column("updatedAt", BigInteger, nullable=False),
    )
    installed = Table(
        names[1], metadata,
        Column("tableName", String(31), primary_key=True),
        Column("name", Text, primary_key=True),
        Column("kind", String(100), nullable=False),
        Column("configHash", String(32), nullable=False),
        Column("installedUntil", BigInteger, nullable=False),
        Column("updatedAt", BigInteger, nullable=False),
    )
    return [entries, installed]


#: Migration 18: one row per running scheduler (its configuration, heartbeat and what it found in
#: force), from which schedulers of different configurations agree on one
#: (delayq_transport/scheduling/authority.py).
SCHEDULERS_TABLE = "delayq_schedule_schedulers"


def schedulers_table(metadata: MetaData | None = None) -> Table:
    """Migration 18's table, keyed by the ledger's ``tableName`` (``<table>`` or
    ``<table>#<namespace>``: Text, so a namespaced name never overflows) and a scheduler id.
    ``configSince`` is when its configuration was first seen by any scheduler, ``entries`` how
    many of its entries are valid, ``follows`` the
    configuration it found in force at its last refresh, ``aliveUntil`` when its heartbeat
    lapses (times in epoch ms, on the database clock)."""
    from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, Text

    return Table(
        SCHEDULERS_TABLE, metadata or MetaData(),
        Column("tableName", Text, primary_key=True),
        Column("schedulerId", String(32), primary_key=True),
        Column("process", Text, nullable=False),
        Column("configHash", String(32), nullable=False),
        Column("configSince", BigInteger, nullable=False),
        Column("entries", Integer, nullable=False),
        Column("follows", String(32), nullable=False),
        Column("seenAt", BigInteger, nullable=False),
        Column("aliveUntil", BigInteger, nullable=False),
    )


def _create_schedulers_table(conn: psycopg.Connection[Any], q: Queries) -> None:
    """Migration 18 (idempotent: CREATE ... IF NOT EXISTS, the table is shared). The roles
    granted on the scheduling ledger get the same on it (writers all four rights, readers
    SELECT), so a scheduler or a monitor granted before the upgrade keeps working."""
    for statement in ddl(schedulers_table()):
        conn.execute(statement)
    row = conn.execute(q["table_schema"]).fetchone()
    assert row is not None
    for role, writes in conn.execute(q["schedule_ledger_grantees"]).fetchall():
        block = "schema_schedulers_grant_writer" if writes else "schema_schedulers_grant_reader"
        for statement in schema_statements(block, table=q.table, schema=str(row[0]),
                                           role=str(role)):
            conn.execute(statement)


def controls_tables(queue_table_name: str, metadata: MetaData | None = None) -> list[Table]:
    """Migration 21's tables of fleet-wide control (core/queue/controls.py), beside the queue
    table, which keeps its columns and indexes: one row per controlled queue (paused, limits,
    the queue's token bucket), the slots held under a concurrency limit (one per leased row, by
    row id, swept once its row is acked, released or its lease lapsed) and the per-key token
    buckets."""
    from sqlalchemy import (
        BigInteger,
        Boolean,
        Column,
        Float,
        Index,
        Integer,
        MetaData,
        Table,
        Text,
    )

    metadata = metadata or MetaData()
    controls = Table(
        f"{queue_table_name}__controls", metadata,
        Column("name", Text, primary_key=True),
        Column("paused", Boolean, nullable=False, server_default="false"),
        Column("concurrency", Integer, nullable=True),
        Column("keyConcurrency", Integer, nullable=True),
        Column("rateCount", Integer, nullable=True),
        Column("rateMs", BigInteger, nullable=True),
        Column("keyRateCount", Integer, nullable=True),
        Column("keyRateMs", BigInteger, nullable=True),
        Column("tokens", Float, nullable=False, server_default="0"),
        Column("refilledAt", BigInteger, nullable=False, server_default="0"),
        Column("updatedAt", BigInteger, nullable=False),
    )
    slots = Table(
        f"{queue_table_name}__control_slots", metadata,
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("lock", Text, nullable=False),
        Column("name", Text, nullable=False),
        Column("key", Text, nullable=True),
    )
    Index(f"{queue_table_name}__control_slots_by_name", slots.c.name, slots.c.key)
    keys = Table(
        f"{queue_table_name}__control_keys", metadata,
        Column("name", Text, primary_key=True),
        Column("key", Text, primary_key=True),
        Column("tokens", Float, nullable=False),
        Column("refilledAt", BigInteger, nullable=False),
    )
    Index(f"{queue_table_name}__control_keys_by_refill", keys.c.name, keys.c.refilledAt)
    return [controls, slots, keys]


def _create_controls(conn: psycopg.Connection[Any], q: Queries) -> None:
    """Migration 21: the control tables and the claim function of a controlled queue. The
    roles that may poll (UPDATE on the queue table) get the rights the claim needs, those that
    only read it (monitors) what status shows, so roles granted before the upgrade keep
    working; `delayq grants` prints them for new roles."""
    for table in controls_tables(q.table):
        for statement in ddl(table):
            conn.execute(statement)
    conn.execute(q["controls_claim_function"])
    row = conn.execute(q["table_schema"]).fetchone()
    assert row is not None
    for role, polls in conn.execute(q["table_readers_and_pollers"]).fetchall():
        block = "schema_controls_grant_poller" if polls else "schema_controls_grant_reader"
        for statement in schema_statements(block, table=q.table, schema=str(row[0]),
                                           role=str(role)):
            conn.execute(statement)


def create_periodic_tables(conn: psycopg.Connection[Any], q: Queries) -> None:
    """Migration 10 (idempotent: CREATE ... IF NOT EXISTS), under the names it was released
    with; migration 16 renames them."""
    for table in periodic_tables(names=(LEGACY_ENTRIES_TABLE, LEGACY_INSTALLED_TABLE)):
        for statement in ddl(table):
            conn.execute(statement)


def _ledger_first_install(conn: psycopg.Connection[Any], q: Queries) -> None:
    conn.execute(q["beat_ledger_first_install_column"])


def _rename_schedule_tables(conn: psycopg.Connection[Any], q: Queries) -> None:
    """Migration 16: the scheduling engine's tables named for what they are. They are shared by
    every queue table but migrated once per queue table, so this meets one of three states:
    only the old names (the first queue table to get here: renamed, primary keys too); the new
    names only (a queue table after it); or both, when migration 10 of a queue table migrated
    after the rename made the old ones again (empty, but merged all the same, new rows winning)
    and they are dropped."""
    row = conn.execute(q["schedule_tables_present"]).fetchone()
    assert row is not None
    old, new = bool(row[0]), bool(row[1])
    if old and not new:
        conn.execute(q["schedule_tables_rename"])
    elif old:
        conn.execute(q["schedule_tables_merge"])


def _create_revoke_function(conn: psycopg.Connection[Any], q: Queries) -> None:
    """The table's revoke function, executable by the roles that may already publish (INSERT)
    into it, so revoking works after the upgrade without re-running ``delayq grants``."""
    row = conn.execute(q["table_schema"]).fetchone()
    assert row is not None
    schema = str(row[0])
    for statement in schema_statements("schema_revoke_function", table=q.table, schema=schema):
        conn.execute(statement)
    for (role,) in conn.execute(q["table_insert_grantees"]).fetchall():
        for statement in schema_statements("schema_revoke_grant", table=q.table, schema=schema,
                                           role=str(role)):
            conn.execute(statement)


#: Applied in order; never edit a released migration, add a new one.
MIGRATIONS: list[Migration] = [
    Migration(1, "delayed_queue table and its three indexes (docs/explanation/design.md)",
              _create_queue_table, lock="none"),
    Migration(2, "NOTIFY wake-ups on insert and on release", _create_notify_triggers,
              lock="SHARE ROW EXCLUSIVE"),
    Migration(3, "exchange bindings shared across processes", _create_bindings_table,
              lock="none"),
    Migration(4, "per-table autovacuum settings for a churning queue", _queue_autovacuum,
              lock="SHARE UPDATE EXCLUSIVE"),
    Migration(5, "insert trigger skips publishes that sent their own NOTIFY",
              _skip_notify_of_self_notifying_inserts, lock="ACCESS EXCLUSIVE"),
    Migration(6, "fillfactor 50: a lease's new row version stays on its page (less WAL)",
              _queue_fillfactor, lock="SHARE UPDATE EXCLUSIVE"),
    Migration(10, "delayq_beat: DB-backed entries and installed-entry ledger",
              create_periodic_tables, lock="none"),
    Migration(11, "run ledger: applied parts of Spark runs and stream micro-batches",
              _create_runs_table, lock="none"),
    Migration(12, "scheduling ledger: when each entry was first installed (interval anchors, "
              "one-offs)", _ledger_first_install, lock="ACCESS EXCLUSIVE",
              lock_on=LEGACY_INSTALLED_TABLE),
    Migration(13, "revoke function: a role without DELETE revokes a waiting task by key",
              _create_revoke_function, lock="ROW EXCLUSIVE"),
    Migration(14, "wake-ups of other writers' inserts list every due time (not the earliest)",
              _complete_notify_function, lock="none"),
    Migration(16, "the scheduling engine's tables named for what they are: delayq_beat_entries "
              "and delayq_beat_installed become delayq_schedule_entries and "
              "delayq_schedule_installed", _rename_schedule_tables, lock="ACCESS EXCLUSIVE",
              lock_on=f"{LEGACY_ENTRIES_TABLE} and {LEGACY_INSTALLED_TABLE}"),
    Migration(18, "the scheduling engine's schedulers: which configuration is in force when "
              "schedulers of different releases run at once", _create_schedulers_table,
              lock="none"),
    Migration(21, "fleet-wide control: paused queues, concurrency and rate limits (tables of "
              "their own and the claim function of a controlled queue)",
              _create_controls, lock="none"),
]


def register_migration(migration: Migration) -> None:
    """Let a sibling package (delayq_beat) add its tables to the same numbered sequence."""
    if any(m.version == migration.version for m in MIGRATIONS):
        existing = next(m for m in MIGRATIONS if m.version == migration.version)
        if existing.apply is migration.apply or existing.description == migration.description:
            return
        raise ValueError(f"migration {migration.version} already registered: {existing}")
    MIGRATIONS.append(migration)
    MIGRATIONS.sort(key=lambda m: m.version)


def _lock_key(table: str) -> int:
    digest = hashlib.sha256(f"delayq-migrate:{table}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def serialise_schema_work(conn: psycopg.Connection[Any], q: Queries, *,
                          lock_timeout: str | None = None) -> None:
    """Take the migrations' advisory lock in this transaction, under limits fit for schema
    work whatever the role's (``migrations_limits``: no statement_timeout; for the DDL, the
    role's lock_timeout unless ``lock_timeout`` is given).

    One lock for every table: they share the ledger, whose CREATE TABLE IF NOT EXISTS races
    (duplicate pg_type) when two tables migrate at once on a fresh database."""
    row = conn.execute(q["migrations_limits"]).fetchone()
    conn.execute(q["migrations_lock"], {"lock_key": _lock_key(MIGRATIONS_TABLE)})
    if lock_timeout is None:
        lock_timeout = row[0] if row else "0"
    conn.execute(q["migrations_lock_timeout"], {"lock_timeout": lock_timeout})



def migrate(db: Database, table: str) -> list[int]:
    """Apply missing migrations to ``table``; return the versions applied by this call."""
    q = Queries(table)

    def work(conn: psycopg.Connection[Any]) -> list[int]:
        with conn.transaction():
            serialise_schema_work(conn, q)
            conn.execute(q["migrations_ensure"])
            done = {row[0] for row in conn.execute(q["migrations_applied"], {"table_name": table})}
            applied = []
            for migration in MIGRATIONS:
                if migration.version in done:
                    continue
                log.info("delayq: applying migration %s to %s: %s",
                         migration.version, table, migration.description)
                migration.apply(conn, q)
                conn.execute(
                    q["migrations_record"], {"table_name": table, "version": migration.version}
                )
                applied.append(migration.version)
            return applied

    return db.run(work)


def applied_versions(db: Database, table: str) -> set[int]:
    """Versions the ledger records for ``table``, read-only (no ledger yet: none)."""
    try:
        rows = db.fetchall(Queries(table)["migrations_applied"], {"table_name": table})
    except SchemaMissing:
        return set()
    except PermissionDenied as exc:
        raise PermissionDenied(
            f"{exc}; every delayq role needs SELECT on {MIGRATIONS_TABLE} to check the schema "
            "(see `delayq grants`)") from exc
    return {int(r[0]) for r in rows}


def missing_migrations(db: Database, table: str) -> list[Migration]:
    """Registered migrations the ledger does not record for ``table``, in order."""
    done = applied_versions(db, table)
    return [m for m in MIGRATIONS if m.version not in done]


def ensure_schema(db: Database, table: str) -> list[int]:
    """What first use runs: read the ledger (needs only SELECT) and migrate only if something
    is missing, so a role without DDL rights works once ``delayq migrate`` has run.

    A role that cannot run the missing DDL gets :class:`SchemaMissing` naming the migrations
    and the command to run as an admin, instead of "permission denied for schema public".
    """
    missing = missing_migrations(db, table)
    if not missing:
        return []
    try:
        return migrate(db, table)
    except PermissionDenied as exc:
        names = "; ".join(f"{m.version} ({m.description})" for m in missing)
        raise SchemaMissing(
            f"the schema of {table!r} is not current: missing migration(s) {names}. This role "
            f"cannot apply them ({exc}); run `delayq migrate` as a role that may run DDL (the "
            "tables' owner), see `delayq grants` and docs/how-to/roles.md"
        ) from exc


#: What a refusal of :func:`require_schema` ends with: the one step that creates the schema.
RUN_MIGRATE = "run `delayq migrate`"


def require_schema(db: Database, table: str) -> None:
    """What a command that must not run DDL calls instead of :func:`ensure_schema`: check that
    the tables exist and are current, change nothing. Without this, opening the queue to read
    it would create all of delayq's tables in a database that had none (a mistyped ``-d``), or
    fail with a raw "permission denied for schema public" for a role that may not.

    Raises :class:`SchemaMissing` naming the database and ``delayq migrate``.
    """
    row = db.fetchone(Queries(table)["migrations_present"])
    assert row is not None
    has_table, has_ledger, dbname = bool(row[0]), bool(row[1]), str(row[2])
    default = table == "delayed_queue"
    which = "" if default else f" for table {table!r}"
    run = RUN_MIGRATE if default else f"run `delayq --table {table} migrate`"
    if not has_table:
        raise SchemaMissing(f"no delayq tables{which} in database {dbname!r}: {run}")
    missing = missing_migrations(db, table) if has_ledger else list(MIGRATIONS)
    if missing:
        names = ", ".join(str(m.version) for m in missing)
        raise SchemaMissing(f"the delayq tables{which} in database {dbname!r} lack "
                            f"migration(s) {names}: {run}")


#: How long a worker waits for delayq's tables by default (each front end's ``schema_wait``).
DEFAULT_SCHEMA_WAIT_S = 600.0
#: How often a waiting worker looks for them, and how often it says that it waits.
SCHEMA_CHECK_S = 1.0
SCHEMA_SAY_S = 5.0


def wait_for_schema(db: Database, table: str, *, timeout_s: float, also: str = "",
                    stop: threading.Event | None = None) -> list[int]:
    """What the three workers run on start instead of :func:`ensure_schema`, for a deploy where
    ``delayq migrate`` runs beside the new workers (docs/how-to/upgrade.md).

    A role that may run DDL migrates at once, as :func:`ensure_schema` does. Otherwise the
    worker waits: it checks read-only every SCHEMA_CHECK_S and logs one line every SCHEMA_SAY_S
    naming ``delayq migrate`` (and ``also``, the front end's own command); once the tables are
    current (and readable: their grants may follow the migration) it starts. After
    ``timeout_s`` (0: at once) it raises what :func:`ensure_schema` raised, naming the wait, or
    the PermissionDenied of tables it may still not read; as soon as ``stop`` is set (the
    worker told to shut down meanwhile), what ensure_schema raised, saying so.
    """
    try:
        return ensure_schema(db, table)
    except SchemaMissing as exc:
        if timeout_s <= 0:
            raise
        first = exc
    deadline, said = time.monotonic() + timeout_s, float("-inf")
    stop = stop or threading.Event()
    while True:
        try:
            require_schema(db, table)
            log.info("delayq: the tables of %r are current: starting", table)
            return []
        except (SchemaMissing, PermissionDenied) as exc:
            why = exc
        now = time.monotonic()
        if stop.is_set():
            raise SchemaMissing(f"{first} (stopped while waiting)") from first
        if now >= deadline:
            if isinstance(why, PermissionDenied):
                raise why
            raise SchemaMissing(f"{first} (gave up after waiting {timeout_s:g} s)") from first
        if now - said >= SCHEMA_SAY_S:
            said = now
            log.warning("delayq: waiting for its tables: %s%s; looking again every %g s, "
                        "giving up in %.0f s", why, also, SCHEMA_CHECK_S, deadline - now)
        stop.wait(min(SCHEMA_CHECK_S, deadline - now))


def current_version(db: Database, table: str) -> int:
    return max(applied_versions(db, table), default=0)


def set_unlogged(db: Database, table: str, unlogged: bool) -> bool:
    """Make the queue table UNLOGGED (or logged again); return whether it changed.

    Opt-in durability trade (the ``unlogged_table`` transport option): no WAL is written for the
    table's rows, so every publish, lease and ack is cheaper, but a PostgreSQL crash (not a
    clean restart) truncates the table, countdowns included, and standbys never see it. The
    change rewrites the table under an exclusive lock, so it is made only when the table is not
    already in the state asked for, under the migrations' advisory lock.
    """
    q = Queries(table)
    want = "u" if unlogged else "p"

    def current(conn: psycopg.Connection[Any]) -> str:
        row = conn.execute(q["table_persistence"]).fetchone()
        assert row is not None
        return str(row[0])

    def work(conn: psycopg.Connection[Any]) -> bool:
        if current(conn) == want:
            return False
        with conn.transaction():
            serialise_schema_work(conn, q)
            if current(conn) == want:
                return False
            log.warning("delayq: making table %s %s", table,
                        "UNLOGGED (a PostgreSQL crash empties it)" if unlogged else "LOGGED")
            conn.execute(q["table_set_unlogged" if unlogged else "table_set_logged"])
            return True

    return db.run(work)
