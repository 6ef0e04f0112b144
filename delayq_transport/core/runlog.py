"""The demo's run log: which demo task ran, retried or finished, and when.

``delayq demo`` shows its tasks going from scheduled to running to done; "done" leaves no row
in the queue (an ack deletes it), so the demo's Celery app records each step here. A plain
table outside the queue, reset at each demo start; its statements live in ``queries.sql``
like every other statement delayq sends.
"""

from __future__ import annotations

from datetime import datetime

from .db import Database
from .queries import Queries


class RunLog:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.q = Queries("delayed_queue")  # the statements name their own table

    def reset(self) -> None:
        self.db.execute(self.q["runlog_reset"])

    def record(self, task_id: str, attempt: int, state: str) -> None:
        self.db.execute(self.q["runlog_record"],
                        {"task_id": task_id, "attempt": attempt, "state": state})

    def steps(self) -> list[tuple[str, str, datetime]]:
        """(task id, state, when) of every step, oldest first."""
        return [(r[0], r[1], r[2]) for r in self.db.fetchall(self.q["runlog_list"])]
