"""The driver's side of run ids: applied once, even after the tasks ran (issue 29).

``schedule_tasks(..., run_id=...)`` and every micro-batch of ``schedule_stream`` (run id
``stream/<query id>/<batch id>``) are runs of the ledger of :mod:`..core.ledgers`. Each Spark
partition is one part, applied and recorded in its own transaction (:mod:`.partition`). Here:

* before the job, the ledger is pruned (retention) and read: a run recorded whole returns at
  once, writing nothing (``skipped``) without a Spark job, whatever its input looks like now;
  a run recorded in part is checked first (:func:`verify_parts`, one pass without writes):
  every recorded part must still be there with the same records;
* in the job, each key's 64-bit hash (:func:`key_hashes`) feeds its part's fingerprint;
* after every partition is in, the driver records the whole run, on the connection it opened
  first (:func:`driver_queue`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..core import InvalidInput, RunMismatch
from ..core.db import normalize_url
from ..core.ledgers import (
    DEFAULT_RETENTION_MS,
    Recorded,
    RunState,
    prune_runs,
    run_state,
    validate_run_id,
)
from ..core.queue import DelayedQueue, duration_ms
from .partition import FINGERPRINTS, fingerprint_partition
from .rows import Plan

#: ``run_retention`` by default: how long a run id protects its re-runs.
RUN_RETENTION = timedelta(milliseconds=DEFAULT_RETENTION_MS)
#: Where the key starts in a binary COPY tuple (1-based, after the field count and its length).
_KEY_AT = 7


def check_run_options(run_id: object, retention: timedelta | float) -> int:
    """Validate a run id (None: no run) and return the retention in ms."""
    if run_id is not None:
        validate_run_id(run_id)
    retention_ms = duration_ms(retention, what="run_retention")
    if retention_ms <= 0:
        raise InvalidInput(f"run_retention must be positive, got {retention!r}")
    return retention_ms


@contextmanager
def driver_queue(database_url: str, table: str, kind: str) -> Iterator[DelayedQueue]:
    """The driver's one connection for a job, open from the start (connect and migrate: fail
    fast) to the whole run's record after the job."""
    normalize_url(database_url)
    with DelayedQueue(database_url, kind=kind, table=table, pool_max_size=1) as queue:
        yield queue


def open_run(queue: DelayedQueue, run_id: str | None, retention_ms: int) -> RunState | None:
    """For a run: prune the ledger (retention), then read what it holds of this run."""
    if run_id is None:
        return None
    prune_runs(queue, retention_ms)
    return run_state(queue, run_id)


def verify_parts(records: DataFrame, plan: Plan, state: RunState) -> None:
    """A run recorded in part is checked whole before anything more is written: one pass
    (no writes) computes the records and fingerprint of each partition whose index the ledger
    holds. A recorded part that is missing now or holds other records means the input, or
    its split into partitions, changed: the rows of that part may now sit in partitions
    that would write them again, so nothing is written (:class:`RunMismatch`)."""
    assert plan.run_id is not None
    counted = partial(fingerprint_partition, plan, frozenset(state.parts))
    found = {int(r.part): Recorded(int(r.rows), int(r.fingerprint))
             for r in records.mapInArrow(counted, FINGERPRINTS).collect()}
    changed = sorted(p for p, recorded in state.parts.items() if found.get(p) != recorded)
    if changed:
        raise RunMismatch(
            f"run {plan.run_id!r} was partly applied, and its part(s) {changed[:5]} are "
            "missing now or hold other records: the input or its split into partitions "
            "changed, so rows already applied could be scheduled again. Nothing was written. "
            "Re-run with the input and partitioning of the first attempt, or under a new run "
            "id (keys then protect only rows still waiting)")


def key_hashes(record: Column) -> Column:
    """xxhash64 of the key inside each binary COPY tuple (null for a null tuple): the same
    value as ``xxhash64`` of the key string, which the JVM encoder hashes directly."""
    key_length = F.conv(F.hex(record.substr(3, 4)), 16, 10).cast("int")
    return F.when(record.isNotNull(), F.xxhash64(record.substr(F.lit(_KEY_AT), key_length)))
