"""What ``delayq demo`` keeps in a database: its own queue table and run log, claimed per run.

The demo may be pointed at any database (``DELAYQ_DATABASE_URL``), a production one included, so
it works only in objects of its own: the queue table :data:`DEMO_TABLE` (with its bindings and
run ledger) and the run log ``delayq_demo__log``, each marked (``queries.DEMO_MARK``) when the
demo creates it. It never purges, consumes or drops anything else. A run holds a session advisory
lock (:meth:`DemoSite.claim`) so a second demo on the same database is refused while the first
runs, and an object of the demo's name that the demo did not mark is refused, not reused.

The run log records which demo task ran, retried or finished, and when: "done" leaves no row in
the queue (an ack deletes it), so the demo's Celery app records each step there.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

import psycopg

from ..db.database import Database
from ..db.errors import DelayqError
from ..db.queries import Queries, demo_log_name, runs_table_name
from ..schema.migrations import migrate

#: The demo's queue table, and its Celery queue (the rows' kind) inside it.
DEMO_TABLE = "delayq_demo"
DEMO_QUEUE = "delayq_demo"


class DemoRefused(DelayqError):
    """The demo will not run here: another demo runs, or a name it needs is someone else's."""


def demo_tables(table: str = DEMO_TABLE) -> tuple[str, ...]:
    """Every table the demo creates: the queue table, its bindings and run ledger, the run log."""
    return (table, f"{table}__bindings", runs_table_name(table), demo_log_name(table))


def _claim_key() -> int:
    digest = hashlib.sha256(f"delayq-demo:{DEMO_TABLE}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class DemoSite:
    """The demo's objects in one database, claimed for the duration of one run."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.q = Queries(DEMO_TABLE)
        self._claim: psycopg.Connection[Any] | None = None

    def claim(self) -> None:
        """Hold the demo's advisory lock on a connection of its own until :meth:`release`, then
        check that every existing table of the demo's names is the demo's own."""
        conn = self.db.connect(autocommit=True)
        row = conn.execute(self.q["demo_claim"], {"lock_key": _claim_key()}).fetchone()
        if not row or not row[0]:
            conn.close()
            raise DemoRefused(
                "another `delayq demo` is running on this database (it holds the demo's lock): "
                "wait until it ends, or point this one at another database")
        self._claim = conn
        try:
            self._check_own()
        except BaseException:
            self.release()
            raise

    def _check_own(self) -> None:
        names = list(demo_tables())
        rows = self.db.fetchall(self.q["demo_table_marks"], {"names": names})
        foreign = [name for name, ours in rows if not ours]
        if foreign:
            raise DemoRefused(
                f"table(s) {', '.join(foreign)} exist in this database and were not created by "
                "`delayq demo`; the demo works only in tables of its own and leaves these "
                "alone. Point it at another database (-d), or, if they are left from an "
                "interrupted first demo, remove them with "
                f"`delayq --table {DEMO_TABLE} uninstall --yes`")

    def prepare(self) -> None:
        """Create (or reuse) the demo's tables, mark them, and empty the previous run's steps;
        the demo's queue itself is purged by the caller (its waiting rows only)."""
        if self._claim is None:
            raise DemoRefused("the demo's tables are prepared only under its claim")
        migrate(self.db, DEMO_TABLE)
        self.db.execute(self.q["runlog_create"])
        self.db.execute(self.q["demo_mark_tables"])
        self.db.execute(self.q["runlog_reset"])

    def release(self) -> None:
        if self._claim is not None:
            self._claim.close()  # a session advisory lock ends with its session
            self._claim = None

    def __enter__(self) -> DemoSite:
        self.claim()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class RunLog:
    """The demo tasks' steps, in the demo's run log table."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.q = Queries(DEMO_TABLE)

    def record(self, task_id: str, attempt: int, state: str) -> None:
        self.db.execute(self.q["runlog_record"],
                        {"task_id": task_id, "attempt": attempt, "state": state})

    def steps(self) -> list[tuple[str, str, datetime]]:
        """(task id, state, when) of every step, oldest first."""
        return [(r[0], r[1], r[2]) for r in self.db.fetchall(self.q["runlog_list"])]
