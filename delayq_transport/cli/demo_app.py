"""The Celery app ``delayq demo`` runs: configured only by the environment it is given.

It ships inside the package (not in examples/) so the demo works from an installed wheel.
"""

from __future__ import annotations

import os
import time
from functools import cache

from celery import Celery

import delayq_transport  # noqa: F401  - registers the delayq+ scheme (the one extra step)
from delayq_transport.core.db import Database
from delayq_transport.core.ledgers import DEMO_QUEUE, DEMO_TABLE, RunLog

app = Celery("delayq_demo")
app.conf.update(
    broker_url=os.environ.get("DELAYQ_DEMO_BROKER", "delayq+postgresql://localhost/postgres"),
    # The demo's own table and queue: a database the demo is pointed at keeps its tasks.
    broker_transport_options={"polling_interval": 2, "acquire_timeout": 30, "table": DEMO_TABLE,
                              **({"database_url": os.environ["DELAYQ_DEMO_DB"]}
                                 if "DELAYQ_DEMO_DB" in os.environ else {})},
    task_default_queue=DEMO_QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_ignore_result=True,
)


@cache
def _run_log() -> RunLog:
    """One small pool per worker process (prefork children each build their own)."""
    return RunLog(Database(os.environ["DELAYQ_DEMO_DB"], max_size=2))


def _record(task_id: str, attempt: int, state: str) -> None:
    _run_log().record(task_id, attempt, state)


@app.task(bind=True, name="delayq_demo.remind")
def remind(self, who: str) -> str:
    """A countdown task: it reaches the worker only once it is due."""
    _record(self.request.id, self.request.retries, "running")
    time.sleep(0.5)
    _record(self.request.id, self.request.retries, "done")
    return f"reminded {who}"


@app.task(bind=True, name="delayq_demo.flaky", max_retries=2)
def flaky(self, who: str) -> str:
    """Fails on its first run and retries with a countdown kept in the database."""
    _record(self.request.id, self.request.retries, "running")
    if self.request.retries == 0:
        _record(self.request.id, self.request.retries, "retrying")
        raise self.retry(countdown=3)
    _record(self.request.id, self.request.retries, "done")
    return f"finally reminded {who}"
