"""core/ledgers/runs.py with core/integrations/bulk.py: a run's part is applied and recorded in one
transaction, a part found recorded writes nothing (even after its rows were acked and deleted), a
part whose records changed is refused, concurrent attempts of one part apply it once, and the ledger
is pruned after its retention."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from delayq_transport import DelayedQueue
from delayq_transport.core import RunMismatch
from delayq_transport.core.integrations import BulkWriter, copy_record
from delayq_transport.core.ledgers import (
    COMPLETE_PART,
    RunPart,
    add_fingerprints,
    forget_run,
    prune_runs,
    record_run,
    run_state,
)

AT_MS = 4_000_000_000_000


def _records(keys: list[str]) -> bytes:
    return b"".join(copy_record(k, "celery", b"{}", AT_MS) for k in keys)


def _fingerprint(keys: list[str]) -> int:
    return add_fingerprints(*(hash(k) for k in keys))  # any stable per-key hash will do


def _apply(url: str, run: RunPart, keys: list[str], flush_rows: int = 10) -> BulkWriter:
    with BulkWriter(url, flush_rows=flush_rows, run=run) as writer:
        writer.write(_records(keys), len(keys), _fingerprint(keys))
    return writer


def _count(url: str, sql: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def test_fingerprints_wrap_and_ignore_order():
    big = (1 << 63) - 1
    assert add_fingerprints(big, 1) == -(1 << 63)
    assert add_fingerprints(3, -5, big) == add_fingerprints(big, -5, 3)


def test_a_recorded_part_writes_nothing_even_after_its_rows_ran(database_url):
    keys = [f"k{i}" for i in range(25)]
    first = _apply(database_url, RunPart("job-1", 0), keys)
    assert (first.counts.created, first.counts.skipped) == (25, 0)
    with DelayedQueue(database_url, kind="celery") as q:
        assert q.purge() == 25  # what the worker's acks leave: no row to conflict with
        again = _apply(database_url, RunPart("job-1", 0), keys)
        assert (again.counts.created, again.counts.skipped) == (0, 25)
        assert q.count_waiting() == 0
        other_part = _apply(database_url, RunPart("job-1", 1), keys)
        assert other_part.counts.created == 25, "a part is only its own (run, part)"
        state = run_state(q, "job-1")
    assert state.complete is None and sorted(state.parts) == [0, 1]
    assert state.parts[0].rows == 25 and state.parts[0].fingerprint == _fingerprint(keys)


def test_a_failed_part_leaves_neither_rows_nor_its_record(database_url):
    keys = [f"f{i}" for i in range(30)]
    with pytest.raises(RuntimeError), BulkWriter(database_url, flush_rows=10,
                                                 run=RunPart("job-2", 0)) as writer:
        writer.write(_records(keys[:20]), 20, _fingerprint(keys[:20]))  # merged twice
        raise RuntimeError("the executor dies before the part is in")
    assert _count(database_url, "SELECT count(*) FROM delayed_queue") == 0
    assert _count(database_url, "SELECT count(*) FROM delayed_queue__runs") == 0
    assert _apply(database_url, RunPart("job-2", 0), keys).counts.created == 30


def test_a_recorded_part_with_other_records_is_refused(database_url):
    keys = [f"m{i}" for i in range(10)]
    _apply(database_url, RunPart("job-3", 0), keys)
    for changed in (keys[:9], keys[:9] + ["other"], keys + ["extra"]):
        with pytest.raises(RunMismatch, match="'job-3' part 0 was applied with 10 records"):
            _apply(database_url, RunPart("job-3", 0), changed)
    assert _apply(database_url, RunPart("job-3", 0), list(reversed(keys))).counts.skipped == 10


def _lock_waiters(url: str) -> int:
    return _count(url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND datname = current_database()")


def test_concurrent_attempts_of_one_part_apply_it_once(database_url):
    """Speculative attempts: both found the part unrecorded and merge; the second waits on the
    first's uncommitted keys, then finds the part recorded and rolls its own work back."""
    keys = [f"c{i}" for i in range(40)]
    run = RunPart("job-4", 0)
    first = BulkWriter(database_url, flush_rows=10, run=run)
    second = BulkWriter(database_url, flush_rows=10, run=run)
    try:
        second.write(_records(keys[:5]), 5, _fingerprint(keys[:5]))  # checked, staged only
        first.write(_records(keys), 40, _fingerprint(keys))  # merged, not committed
        finisher = threading.Thread(target=lambda: (
            second.write(_records(keys[5:]), 35, _fingerprint(keys[5:])), second.finish()))
        finisher.start()
        deadline = time.monotonic() + 30
        while _lock_waiters(database_url) == 0:  # the second merge waits on first's keys
            assert time.monotonic() < deadline, "the second attempt never waited on the first"
            time.sleep(0.02)
        assert first.finish().created == 40
        finisher.join(timeout=30)
        assert not finisher.is_alive(), "the second attempt did not finish"
    finally:
        first.close()
        second.close()
    assert (second.counts.created, second.counts.ignored, second.counts.skipped) == (0, 0, 40)
    assert _count(database_url, "SELECT count(*) FROM delayed_queue") == 40
    assert _count(database_url, "SELECT count(*) FROM delayed_queue__runs") == 1


def test_whole_run_record_prune_and_forget(database_url):
    start = datetime(2030, 1, 1, tzinfo=UTC)
    now = [start]
    with DelayedQueue(database_url, kind="celery", clock=lambda: now[0]) as q:
        _apply(database_url, RunPart("old", 0), ["o1"])
        record_run(q, "old", 1)  # written at `start` (the injected clock)
        assert run_state(q, "old").complete is not None
        now[0] = start + timedelta(days=7, seconds=1)
        record_run(q, "new", 5)
        week_ms = 7 * 86_400_000
        # The part of "old" was stamped by the database clock (now, years before 2030).
        assert prune_runs(q, week_ms, limit=1) == 1 and prune_runs(q, week_ms) == 1
        assert prune_runs(q, week_ms) == 0
        assert run_state(q, "old").complete is None and not run_state(q, "old").parts
        assert run_state(q, "new").complete is not None
        assert forget_run(q, "new") == 1 and run_state(q, "new").complete is None
    assert _count(database_url, "SELECT count(*) FROM delayed_queue__runs") == 0
    assert COMPLETE_PART == -1
