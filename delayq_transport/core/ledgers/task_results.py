"""Task results: what a worker records about each task it runs, readable from any process.

Django's task framework (``django.tasks``, delayq_transport/django/tasks.py) asks a backend for
a task's status, timestamps, return value, errors and the workers that ran it. A task's queue
row says whether it waits (READY) or is leased; what happened to it once it ran outlives the
row, which is deleted by its ack. So each run's outcome is kept here, in one table shared by
every queue table of the database (``delayq_task_results``, keyed by the queue table's name
and the task's key, as the scheduling engine's tables are):

* :meth:`TaskResults.start`: an attempt begins (status RUNNING, this worker appended), unless
  the row is final already: the outcome was recorded, then the worker died before its ack was
  flushed, and the redelivery must not run the task a second time. A row found RUNNING is an
  attempt that never settled (killed): the caller's entry for it is appended to ``errors``;
* :meth:`TaskResults.finish`: the attempt's outcome (SUCCESSFUL, FAILED, or READY again while a
  retry waits), its error appended, its return value kept; written before the queue row is
  acked, so a crash in between re-delivers a row whose result is final (see ``start``);
* :meth:`TaskResults.touch` and :meth:`TaskResults.interrupt`: the running attempts' liveness
  (``aliveUntil``, migration 17), and an attempt given back unsettled (READY again, its entry
  appended), before its queue row is released;
* :meth:`TaskResults.get`: the result row and the task's queue row by key, in one statement,
  with whether a RUNNING result is in fact interrupted (nothing runs it) and when it runs again;
* :meth:`TaskResults.prune`: finished results older than a retention, a batch at a time;
* :meth:`TaskResults.walk` and :meth:`TaskResults.summaries`: the lists of finished results
  (all, or the failed ones), newest first: a bounded index walk, then the page's rows;
* :meth:`TaskResults.reopen` and :meth:`TaskResults.discard`: an operator's retry of a failed
  task (result READY again and a new row, in one transaction) and its removal.

Times are epoch milliseconds given by the caller (the worker's clock, as Django's own
backends take ``timezone.now()``), except the liveness, which is the database clock's on both
sides (the writer's and the reader's hosts may disagree). JSON values are passed as JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from ..db.errors import InvalidInput
from ..db.queries import RESULTS_TABLE
from ..queue.counts import bounded_read
from ..queue.joined import transaction
from ..queue.types import OfferOutcome
from ..schema.migrations import Migration, ddl, register_migration

if TYPE_CHECKING:
    from sqlalchemy import MetaData, Table

    from ..db.queries import Queries
    from ..queue import DelayedQueue

#: The shared table (one per database, rows keyed by ``tableName``).
#: Statuses a result does not leave (a redelivery of a task in one of them is only acked).
FINAL = ("SUCCESSFUL", "FAILED")
#: Rows deleted per statement by :meth:`TaskResults.prune`.
PRUNE_BATCH = 1000
#: What :meth:`TaskResults.walk` walks: the statement of each.
WALKS = {"finished": "task_results_walk", "failed": "task_results_walk_failed"}
#: Results one walk reads at most.
MAX_WALK = 5000


def task_results_table(metadata: MetaData | None = None) -> Table:
    from sqlalchemy import BigInteger, Column, Index, MetaData, String, Table
    from sqlalchemy.dialects.postgresql import JSONB

    table = Table(
        RESULTS_TABLE, metadata or MetaData(),
        Column("tableName", String(31), primary_key=True),
        Column("id", String(200), primary_key=True),
        Column("task", JSONB, nullable=False),
        Column("status", String(16), nullable=False),
        Column("enqueuedAt", BigInteger, nullable=True),
        Column("startedAt", BigInteger, nullable=True),
        Column("lastAttemptedAt", BigInteger, nullable=True),
        Column("finishedAt", BigInteger, nullable=True),
        Column("returnValue", JSONB, nullable=True),
        Column("errors", JSONB, nullable=False, server_default="[]"),
        Column("workerIds", JSONB, nullable=False, server_default="[]"),
        Column("updatedAt", BigInteger, nullable=False),
    )
    Index(f"{RESULTS_TABLE}__by_finished_at", table.c.tableName, table.c.finishedAt)
    return table


def _create_task_results_table(conn: psycopg.Connection[Any], q: Queries) -> None:
    """Migration 15 (idempotent: CREATE ... IF NOT EXISTS, the table is shared)."""
    for statement in ddl(task_results_table()):
        conn.execute(statement)


register_migration(Migration(
    15, "task results (django.tasks): one row per task a worker started, pruned after a "
    "retention", _create_task_results_table, lock="none"))


def _add_alive_column(conn: psycopg.Connection[Any], q: Queries) -> None:
    conn.execute(q["task_results_alive_column"])


register_migration(Migration(
    17, "task results: each running attempt's liveness (aliveUntil), so a result tells an "
    "attempt nothing runs any more", _add_alive_column, lock="ACCESS EXCLUSIVE",
    lock_on=RESULTS_TABLE))


@dataclass(frozen=True, slots=True)
class LostAttempt:
    """The entry :meth:`TaskResults.start` appends for an attempt it finds unsettled: an
    exception class path and a traceback text, a PostgreSQL ``format()`` template whose two
    ``%s`` take that attempt's number and worker id (``%%`` for a literal ``%``)."""

    exception_class_path: str
    template: str
def _index_failed_results(conn: psycopg.Connection[Any], q: Queries) -> None:
    """Migration 19 (idempotent: the index is shared by every queue table's results)."""
    conn.execute(q["task_results_failed_index"])


register_migration(Migration(
    19, "task results: a partial index of the failed ones (failure lists, the health check)",
    _index_failed_results, lock="SHARE", lock_on=RESULTS_TABLE))


def _index_finished_results(conn: psycopg.Connection[Any], q: Queries) -> None:
    """Migration 20 (idempotent, like 19)."""
    conn.execute(q["task_results_finished_index"])
    conn.execute(q["task_results_drop_by_finished_at"])


register_migration(Migration(
    20, "task results: the index by finish time holds finished results only, so no lookup by "
    "key uses it", _index_finished_results, lock="ACCESS EXCLUSIVE",
    lock_on=f"{RESULTS_TABLE} and {RESULTS_TABLE}__by_finished_at"))


@dataclass(frozen=True, slots=True)
class Attempt:
    """An attempt that :meth:`TaskResults.start` began: the result as it now reads."""

    started_at_ms: int
    worker_ids: list[str]
    errors: list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class StoredResult:
    """One task as :meth:`TaskResults.get` reads it. ``task`` is the JSON the task was
    enqueued with; ``status`` None: no worker started it yet (its queue row waits, or is
    leased when ``leased``). ``interrupted``: the status says RUNNING but nothing runs it (the
    attempt's liveness lapsed, or its row is not held); ``due_at_ms``: the queue row's
    ``scheduledAt`` (when it runs again: a held row's lease end), None without a row."""

    task: dict[str, Any]
    status: str | None
    enqueued_at_ms: int | None
    started_at_ms: int | None
    last_attempted_at_ms: int | None
    finished_at_ms: int | None
    return_value: Any
    errors: list[dict[str, str]]
    worker_ids: list[str]
    queued: bool
    leased: bool
    interrupted: bool
    due_at_ms: int | None
    alive_until_ms: int | None


@dataclass(frozen=True, slots=True)
class Walked:
    """A finished result as a walk passes it: its position (``at_ms``: finishedAt) and what
    lists filter on."""

    id: str
    at_ms: int
    status: str
    queue: str | None
    task: str | None


@dataclass(frozen=True, slots=True)
class ResultSummary:
    """A result as a list shows it: its last error only, its attempts, and its queue row when
    it has one (``row_id``; ``next_at_ms`` its due time, ``held`` a worker has it)."""

    id: str
    task: dict[str, Any]
    status: str
    enqueued_at_ms: int | None
    started_at_ms: int | None
    last_attempted_at_ms: int | None
    finished_at_ms: int | None
    updated_at_ms: int
    last_error: dict[str, str] | None
    errors: int
    attempts: int
    row_id: int | None
    next_at_ms: int | None
    held: bool


class TaskResults:
    """The results of the tasks of one queue table whose kinds start with ``prefix``."""

    def __init__(self, queue: DelayedQueue, prefix: str) -> None:
        self.queue = queue
        self.prefix = prefix
        self._q: Queries = queue.queries
        self._table = queue.table

    def start(self, key: str, task_json: str, enqueued_at_ms: int | None, worker_id: str,
              at_ms: int, *, alive_ms: int, lost: LostAttempt) -> Attempt | None:
        """Begin an attempt, alive for ``alive_ms`` unless touched; None: the result is final
        already (do not run it again). A previous attempt still RUNNING gets ``lost``."""
        rows = self.queue.db.fetchall(self._q["task_results_start"], {
            "table_name": self._table, "id": key, "task": task_json,
            "enqueued_at": enqueued_at_ms, "worker_id": worker_id, "at": at_ms,
            "alive_ms": alive_ms, "lost_class": lost.exception_class_path,
            "lost_template": lost.template, "now": None,
        }, relaxed=True)
        if not rows:
            return None
        started, workers, errors = rows[0]
        return Attempt(int(started), list(workers), list(errors))

    def touch(self, keys: Sequence[str], alive_ms: int) -> int:
        """These running attempts are alive for ``alive_ms`` more; returns how many."""
        if not keys:
            return 0
        return self.queue.db.execute(self._q["task_results_touch"], {
            "table_name": self._table, "ids": list(keys), "alive_ms": alive_ms, "now": None,
        }, relaxed=True)

    def interrupt(self, key: str, attempt: int, error: dict[str, str], at_ms: int) -> bool:
        """Attempt number ``attempt`` is given back unsettled: READY again, ``error`` appended.
        False: it was not RUNNING any more (an outcome was written, or a later attempt began)."""
        rows = self.queue.db.fetchall(self._q["task_results_interrupt"], {
            "table_name": self._table, "id": key, "attempt": attempt, "at": at_ms,
            "errors": json.dumps([error]),
        })
        return bool(rows)

    def finish(self, key: str, status: str, at_ms: int, *, finished: bool,
               return_json: str | None = None, error: dict[str, str] | None = None) -> None:
        """Record an attempt's outcome (``finished``: the task will not run again)."""
        self.queue.db.execute(self._q["task_results_finish"], {
            "table_name": self._table, "id": key, "status": status, "at": at_ms,
            "finished_at": at_ms if finished else None, "return_value": return_json,
            "errors": json.dumps([] if error is None else [error]),
        }, relaxed=True)

    def get(self, key: str) -> StoredResult | None:
        """The task with this key, or None if neither a result nor a queue row has it."""
        row = self.queue.db.fetchone(self._q["task_results_get"], {
            "table_name": self._table, "id": key, "prefix": self.prefix, "now": None})
        if row is None:
            return None
        (task, status, enqueued, started, attempted, finished, value, errors, workers,
         payload, lock, due, alive, interrupted) = row
        if task is None and payload is None:
            return None
        if task is None:
            task = json.loads(bytes(payload))
        return StoredResult(task, status, enqueued, started, attempted, finished, value,
                            list(errors or []), list(workers or []), payload is not None,
                            lock is not None, bool(interrupted), due, alive)

    def kinds(self) -> list[str]:
        """The kinds of the prefix that hold rows now (waiting, leased or not yet acked)."""
        rows = self.queue.db.fetchall(self._q["task_kinds"], {"prefix": self.prefix},
                                      relaxed=True)
        return [str(r[0]) for r in rows]

    def prune(self, before_ms: int, batch: int = PRUNE_BATCH) -> int:
        """Delete results that finished before ``before_ms``; returns how many."""
        total = 0
        while True:
            n = self.queue.db.execute(self._q["task_results_prune"], {
                "table_name": self._table, "before": before_ms, "limit": batch}, relaxed=True)
            total += n
            if n < batch:
                return total

    def walk(self, which: str, before: tuple[int, str], *, lo: int = -(2**63),
             limit: int = 500) -> list[Walked]:
        """Results of ``which`` (a key of :data:`WALKS`) after the keyset cursor ``before``
        = (at_ms, id), newest first, at most ``limit`` (a bounded index walk)."""
        if which not in WALKS or not 1 <= limit <= MAX_WALK:
            raise ValueError(f"walk {which!r} of {limit} results")
        params = {"table_name": self._table, "before_at": int(before[0]),
                  "before_id": str(before[1]), "lo": int(lo), "limit": limit}
        rows = bounded_read(self.queue, WALKS[which], params)
        return [Walked(str(r[0]), int(r[1]), str(r[2]), r[3], r[4]) for r in rows]

    def summaries(self, ids: list[str]) -> list[ResultSummary]:
        """The results of ``ids`` that exist, in the order of ``ids``."""
        if not ids:
            return []
        rows = self.queue.db.fetchall(self._q["task_results_by_ids"], {
            "table_name": self._table, "ids": list(ids), "prefix": self.prefix})
        found = {str(r[0]): ResultSummary(
            str(r[0]), r[1], str(r[2]), r[3], r[4], r[5], r[6], int(r[7]), r[8], int(r[9]),
            int(r[10]), r[11], r[12], r[13] is not None) for r in rows}
        return [found[i] for i in ids if i in found]

    def reopen(self, key: str, kind: str, payload: bytes, at_ms: int) -> bool:
        """Retry a FAILED task: its result READY again and its row offered anew (due now), in
        one transaction. False: the result is not FAILED (nothing changed). InvalidInput: a
        row of that key still exists (its ack is pending): nothing changed either."""
        with self.queue.db.transaction() as conn:
            reopened = conn.execute(self._q["task_results_reopen"], {
                "table_name": self._table, "id": key, "at": at_ms}).fetchone()
            if reopened is None:
                return False
            with transaction(conn):
                outcome = self.queue.with_kind(kind).offer(key, payload, None,
                                                           can_update=False)
            if outcome is not OfferOutcome.CREATED:
                raise InvalidInput(f"task {key}: its row is still there (its worker's "
                                   "acknowledgement is pending): try again in a moment")
        return True

    def discard(self, key: str) -> tuple[int, int]:
        """Forget a failed task, or one waiting for a retry (its row and its result): the
        (rows, results) deleted. A row a worker holds and a RUNNING or SUCCESSFUL result stay."""
        row = self.queue.db.fetchone(self._q["task_results_discard"], {
            "table_name": self._table, "id": key, "prefix": self.prefix})
        assert row is not None
        return int(row[0]), int(row[1])

    def failed_since(self, since_ms: int, cap: int) -> int:
        """Failed results that finished at or after ``since_ms``, counted up to ``cap``."""
        rows = bounded_read(self.queue, "task_results_failed_since", {
            "table_name": self._table, "since": int(since_ms), "cap": int(cap)})
        return int(rows[0][0])
