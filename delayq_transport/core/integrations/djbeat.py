"""django-celery-beat's tables, read and written by named statements (``djbeat_*`` blocks of
``djbeat.sql``): no Django needed, so ``delayq beat import`` runs from any machine that reaches
the database, and a beat in admin mode or a worker reads and writes them without loading the
Django project.

The tables are django-celery-beat's (``django_celery_beat_periodictask`` and its schedules, and
``django_celery_beat_periodictasks``, whose one row's ``last_update`` its saves, deletes and
the admin's bulk actions bump). Their names are fixed by its models; the schema they live in is
the connection's ``search_path`` unless given, validated and quoted like every identifier.

What delayq writes there, and only there: ``enabled`` (``--disable-source`` and ``--undo`` of an
import, with the change mark bumped as the admin does), and in admin mode the run history of an
occurrence a worker received (``last_run_at``, ``total_run_count``, a one-off disabled), once
per occurrence whatever redelivers it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from psycopg import sql

from ..db.errors import InvalidInput, SchemaMissing
from ..db.queries import DJBEAT_PREFIX, NOW_SQL, raw_queries, runs_table_name, validate_table_name

if TYPE_CHECKING:
    from ..db.database import Database

#: django-celery-beat's tables (its models' default ``db_table`` names).
TABLES = {
    "djbeat_task": "django_celery_beat_periodictask",
    "djbeat_interval": "django_celery_beat_intervalschedule",
    "djbeat_crontab": "django_celery_beat_crontabschedule",
    "djbeat_solar": "django_celery_beat_solarschedule",
    "djbeat_clocked": "django_celery_beat_clockedschedule",
    "djbeat_track": "django_celery_beat_periodictasks",
}
#: The run-ledger part under which an occurrence written to a task's run history is claimed.
RUN_PART = -3
#: How long such a claim is kept: far longer than any lease, after which no redelivery comes.
RUN_RETENTION_MS = 86_400_000
PRUNE_BATCH_ROWS = 10_000
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


@dataclass(frozen=True)
class TaskRow:
    """One periodic task with the columns of its schedule (those of other kinds are None)."""

    name: str
    task: str
    args: str
    kwargs: str
    queue: str | None
    exchange: str | None
    routing_key: str | None
    headers: str
    priority: int | None
    expires: datetime | None
    expire_seconds: int | None
    one_off: bool
    start_time: datetime | None
    enabled: bool
    last_run_at: datetime | None
    total_run_count: int
    date_changed: datetime
    description: str
    every: int | None
    period: str | None
    minute: str | None
    hour: str | None
    day_of_week: str | None
    day_of_month: str | None
    month_of_year: str | None
    timezone: str | None
    event: str | None
    latitude: str | None
    longitude: str | None
    clocked_time: datetime | None
    #: How many schedule references the row has (django-celery-beat validates exactly one).
    schedules: int


_COLUMNS = len(fields(TaskRow))


@dataclass(frozen=True)
class Snapshot:
    """The change mark read, and every task when it changed (None: unchanged since ``seen``)."""

    mark: datetime | None
    rows: list[TaskRow] | None


def validate_schema(schema: str | None) -> str | None:
    if schema is not None and not _SCHEMA_RE.match(schema):
        raise InvalidInput(f"invalid schema name {schema!r}: letters, digits, _ or $, "
                           "not starting with a digit")
    return schema


@cache
def statement(name: str, queue_table: str, schema: str | None) -> str:
    """One ``djbeat_*`` block for django-celery-beat's tables in ``schema`` (None: the
    ``search_path``'s) and the run ledger of ``queue_table``."""
    idents: dict[str, Any] = {
        key: sql.Identifier(*((schema,) if schema else ()), table)
        for key, table in TABLES.items()}
    idents["djbeat_task_literal"] = sql.Literal(idents["djbeat_task"].as_string(None))
    idents["runs"] = sql.Identifier(runs_table_name(validate_table_name(queue_table)))
    idents["now"] = sql.SQL(NOW_SQL)
    return sql.SQL(raw_queries()[DJBEAT_PREFIX + name]).format(**idents).as_string(None)


class DjangoBeatTables:
    """django-celery-beat's tables in one database (``db``); ``queue_table`` names the run
    ledger that claims each occurrence written to a task's history."""

    def __init__(self, db: Database, queue_table: str = "delayed_queue", *,
                 schema: str | None = None) -> None:
        self.db = db
        self.queue_table = validate_table_name(queue_table)
        self.schema = validate_schema(schema)

    def _sql(self, name: str) -> str:
        return statement(name, self.queue_table, self.schema)

    def present(self) -> bool:
        """Whether the tables are in this database (in ``schema``, or on the search path)."""
        row = self.db.fetchone(self._sql("present"))
        return bool(row and row[0])

    def read(self, seen: datetime | None = None, *, force: bool = False) -> Snapshot:
        """The change mark, and every task unless the mark is still ``seen`` (and not ``force``).
        One statement: an unchanged mark costs one index probe of a one-row table."""
        force = force or seen is None
        try:
            rows = self.db.fetchall(self._sql("read"), {"seen": seen, "force": force})
        except SchemaMissing as exc:
            raise SchemaMissing(f"django-celery-beat's tables are not in this database "
                                f"({exc}); run Django's `migrate` for django_celery_beat, or "
                                "point at the database (and schema) that holds them") from exc
        mark = rows[0][0] if rows else None
        if not force and mark == seen:
            return Snapshot(mark, None)
        return Snapshot(mark, [TaskRow(*r[1:_COLUMNS + 1]) for r in rows if r[1] is not None])

    def set_enabled(self, names: Sequence[str], enabled: bool) -> list[str]:
        """Enable or disable tasks by name; returns those that changed (the mark is bumped)."""
        if not names:
            return []
        rows = self.db.fetchall(self._sql("set_enabled"),
                                {"names": list(names), "enabled": enabled})
        return [r[0] for r in rows]

    def record_runs(self, runs: Sequence[tuple[str, str, int]],
                    now_ms: int | None = None) -> int:
        """Write (occurrence key, task name, occurrence ms) to the tasks' run history, each key
        once ever (claimed in the run ledger by the same statement); returns the tasks written."""
        unique = list({key: (key, name, at) for key, name, at in runs}.values())
        if not unique:
            return 0
        row = self.db.fetchone(self._sql("record_runs"), {
            "keys": [r[0] for r in unique], "names": [r[1] for r in unique],
            "ats": [int(r[2]) for r in unique], "part": RUN_PART, "now": now_ms})
        return int(row[0]) if row else 0


def prune_run_claims(db: Database, queries: Any, retention_ms: int = RUN_RETENTION_MS,
                     limit: int = PRUNE_BATCH_ROWS, now_ms: int | None = None) -> int:
    """Drop claims of occurrences written to a run history longer ago than the retention."""
    return db.execute(queries["runs_prune_part"], {
        "retention_ms": retention_ms, "limit": limit, "part": RUN_PART, "now": now_ms})
