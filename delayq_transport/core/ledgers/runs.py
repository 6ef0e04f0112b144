"""The run ledger: which parts of which run were applied, so applying them again adds nothing.

Keys make a re-run idempotent only while the rows wait: a worker's ack deletes the row, and a
replayed micro-batch, a retried Spark task or a re-run job would then insert the task again
and it would run twice (issue 29). The ledger (``<table>__runs``, migration 11) remembers
instead that a part was applied. Each part records itself **in the transaction of its own
rows** (``core.integrations.BulkWriter`` with a :class:`RunPart`), so a part is either applied and
recorded or neither, whatever dies when; a part found recorded writes nothing. When every
part is in, the caller records the whole run (part ``-1``), and a later attempt of the run
returns at once.

A part is identified by its position in the run (Spark's partition index), so a re-run must
split its input the same way to be recognised. Each part therefore also records how many
records it applied and a fingerprint of them (a wrapping sum of 64-bit hashes of their keys,
independent of row order); a recorded part whose records differ now raises
:class:`RunMismatch` instead of silently skipping rows it has not applied.

Entries are small (~100 bytes per part) and are deleted ``retention`` after they were
written (:func:`prune_runs`, bounded per call, through the ``appliedAt`` index): a run
re-applied after that is written again, protected only by its keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from ..db.errors import InvalidInput, RunMismatch
from ..db.queries import Queries
from ..queue.validate import MAX_KEY_CHARS, validate_key

if TYPE_CHECKING:
    from ..queue.delayed_queue import DelayedQueue

#: The part number of the row that says every part of the run was applied.
COMPLETE_PART = -1
#: Entries are kept this long by default (a re-run later than that is applied again).
DEFAULT_RETENTION_MS = 7 * 86_400_000
#: Entries deleted by one :func:`prune_runs` call: keeps each call short however far behind.
PRUNE_BATCH_ROWS = 10_000
_U64 = 1 << 64


@dataclass(frozen=True)
class RunPart:
    """One part of one run, as a writer applies it."""

    run_id: str
    part: int


@dataclass(frozen=True)
class Recorded:
    """What the ledger holds for a part (or, for part -1, the whole run)."""

    rows: int
    fingerprint: int


@dataclass(frozen=True)
class RunState:
    complete: Recorded | None
    parts: dict[int, Recorded]


def validate_run_id(run_id: object) -> str:
    return validate_key(run_id, what="run_id", limit=MAX_KEY_CHARS)


def add_fingerprints(*values: int) -> int:
    """Wrapping 64-bit sum (a signed BIGINT), so the order records arrive in does not matter."""
    total = sum(values) % _U64
    return total - _U64 if total >= 1 << 63 else total


def check_part(run: RunPart, recorded: Recorded, rows: int, fingerprint: int) -> None:
    """A part found recorded may be skipped only if it holds the records it was applied with."""
    if (recorded.rows, recorded.fingerprint) != (rows, fingerprint):
        raise RunMismatch(
            f"run {run.run_id!r} part {run.part} was applied with {recorded.rows} records and "
            f"now has {rows} (or other keys): the input or its split into parts changed since. "
            "Nothing of this part was written. Re-run it with the input and partitioning of the "
            "first attempt, or under a new run id (keys then protect only rows still waiting)")


# -- a part, on its writer's connection (core/integrations/bulk.py) --------------------------------


def part_recorded(conn: psycopg.Connection[Any], queries: Queries, run: RunPart) -> Recorded | None:
    row = conn.execute(queries["runs_part"], {"run_id": run.run_id, "part": run.part}).fetchone()
    return None if row is None else Recorded(int(row[0]), int(row[1]))


def record_part(conn: psycopg.Connection[Any], queries: Queries, run: RunPart, rows: int,
                fingerprint: int) -> bool:
    """Record a part in the caller's transaction; False when another attempt recorded it first
    (the caller rolls its own rows back)."""
    params = {"run_id": run.run_id, "part": run.part, "rows": rows,
              "fingerprint": fingerprint, "now": None}
    return conn.execute(queries["runs_record"], params).fetchone() is not None


# -- a whole run, from the caller that started it -----------------------------------------------


def run_state(queue: DelayedQueue, run_id: str) -> RunState:
    rows = queue.db.fetchall(queue.queries["runs_state"], {"run_id": run_id})
    parts = {int(p): Recorded(int(n), int(f)) for p, n, f in rows}
    return RunState(parts.pop(COMPLETE_PART, None), parts)


def record_run(queue: DelayedQueue, run_id: str, rows: int) -> None:
    """Every part is in: later attempts of the run need not look at its parts."""
    queue.db.execute(queue.queries["runs_record"], {
        "run_id": run_id, "part": COMPLETE_PART, "rows": rows, "fingerprint": 0,
        "now": queue.clock_ms()})


def prune_runs(queue: DelayedQueue, retention_ms: int = DEFAULT_RETENTION_MS,
               limit: int = PRUNE_BATCH_ROWS) -> int:
    """Delete up to ``limit`` entries written more than ``retention_ms`` ago; returns how many."""
    if not isinstance(retention_ms, int) or retention_ms < 0:
        raise InvalidInput(f"retention_ms must be an int >= 0, got {retention_ms!r}")
    return queue.db.execute(queue.queries["runs_prune"], {
        "retention_ms": retention_ms, "limit": limit, "now": queue.clock_ms()})


def forget_run(queue: DelayedQueue, run_id: str) -> int:
    """Drop every entry of a run, so its next attempt applies everything again (keys only)."""
    return queue.db.execute(queue.queries["runs_forget"], {"run_id": validate_run_id(run_id)})
