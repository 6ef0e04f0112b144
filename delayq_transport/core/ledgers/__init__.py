"""The ledgers: small tables that remember what was done, so doing it again adds nothing.

The run ledger (``<table>__runs``, :mod:`.runs`): which parts of a run were applied, each
recorded in the transaction of its own rows (Spark's run ids and stream micro-batches; the
queue's ``offer_once`` records ``delayq move-from``'s source ids in it too, and the scheduling
integration its django-celery-beat run claims). ``delayq demo``'s own queue table, claim and
run log (:mod:`.demo_tables`). Django task framework results (``delayq_task_results``,
:mod:`.task_results`: each task's attempts and outcome, migration 15). Their statements are
``ledgers.sql``; the few a layer below or beside runs on the same ledger (``once_*`` of the
queue, ``runs_prune_part`` of djbeat) live with the code that runs them.
"""

from __future__ import annotations

from .demo_tables import DEMO_QUEUE, DEMO_TABLE, DemoSite, RunLog, demo_tables
from .runs import (
    COMPLETE_PART,
    DEFAULT_RETENTION_MS,
    Recorded,
    RunPart,
    RunState,
    add_fingerprints,
    forget_run,
    prune_runs,
    record_run,
    run_state,
    validate_run_id,
)
from .task_results import Attempt, LostAttempt, ResultSummary, StoredResult, TaskResults, Walked

__all__ = [
    "Attempt",
    "COMPLETE_PART",
    "DEFAULT_RETENTION_MS",
    "DEMO_QUEUE",
    "DEMO_TABLE",
    "DemoSite",
    "LostAttempt",
    "Recorded",
    "ResultSummary",
    "RunLog",
    "RunPart",
    "RunState",
    "StoredResult",
    "TaskResults",
    "Walked",
    "add_fingerprints",
    "demo_tables",
    "forget_run",
    "prune_runs",
    "record_run",
    "run_state",
    "validate_run_id",
]
