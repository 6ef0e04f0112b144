"""core/integrations/bulk.py: COPY into a staging table and one merge per flush, counted exactly."""

from __future__ import annotations

import psycopg

from delayq_transport import DelayedQueue
from delayq_transport.core.integrations import BulkWriter, copy_record


def _records(keys: list[str], kind: str = "celery", at: int = 4_000_000_000_000,
             payload: bytes = b"{}") -> bytes:
    return b"".join(copy_record(k, kind, payload, at) for k in keys)


def test_ignore_counts_created_ignored_and_repeats(database_url):
    keys = [f"k{i}" for i in range(250)]
    with BulkWriter(database_url, flush_rows=100) as w:
        w.write(_records(keys[:150]), 150)  # merged once (>= 100)
        w.write(_records(keys[100:] + ["k0", "k0"]), 152)
    assert (w.counts.created, w.counts.updated, w.counts.ignored) == (250, 0, 52)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM delayed_queue").fetchone() == (250,)
    with DelayedQueue(database_url, kind="celery") as q:
        stored = q.get("k7")
        assert stored is not None and stored.payload == b"{}"
        assert stored.scheduled_at_ms == stored.scheduled_at_initially_ms == 4_000_000_000_000


def test_update_replaces_changed_and_in_flight_rows_only(database_url):
    with BulkWriter(database_url) as w:
        w.write(_records(["a", "b", "c"]), 3)
    with DelayedQueue(database_url, kind="celery") as q:
        q.offer("due", b"{}", None)
        taken = q.try_poll()
        assert taken is not None and taken.key == "due"
        with BulkWriter(database_url, can_update=True) as w:
            w.write(_records(["a"]) + _records(["b"], payload=b"[]")
                    + _records(["due", "new", "new"]), 5)
        assert (w.counts.created, w.counts.updated, w.counts.ignored) == (1, 2, 2)
        b = q.get("b")
        assert b is not None and b.payload == b"[]"
        due = q.get("due")
        assert due is not None and not due.in_flight
        assert q.ack(taken) == 0, "the replaced delivery's ack is a no-op"


def test_failed_writer_keeps_whole_merges_and_rerun_is_idempotent(database_url):
    """A writer that dies keeps its whole merges (autocommit each); behind a transaction pooler
    (tests/topology) the writer is one transaction and keeps nothing. A re-run adds the rest."""
    keys = [f"r{i}" for i in range(30)]
    try:
        with BulkWriter(database_url, flush_rows=10) as w:
            pooled = w._db.transaction_pooling
            w.write(_records(keys[:20]), 20)  # merged
            w.write(_records(keys[20:25]), 5)  # staged only
            raise RuntimeError("writer dies")
    except RuntimeError:
        pass
    with BulkWriter(database_url, flush_rows=10) as again:
        again.write(_records(keys), 30)
    kept = 0 if pooled else 20
    assert (again.counts.created, again.counts.ignored) == (30 - kept, kept)
