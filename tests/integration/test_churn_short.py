"""The churn scenario's load, short (``bench/apps/steady.py``; issue 10, part 3): a fixed
load with 100k far-future rows for 13 s delivers every row once, its polls read a few index
pages each (they stop at now, never walking the far-future rows), and the table grows no more
than the rows it churned can explain. Rate, pick-up latency and poll time are the
benchmark's to measure (the ``churn`` scenario of ``bench/run.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "apps"))

from steady import SteadyConfig, SteadyRun, prepare  # noqa: E402

RATE = 200.0
SECONDS = 13.0
FAR_ROWS = 100_000
#: Heap + index bytes one churned row may leave behind before vacuum (payload 200 B, three
#: index entries per version, two versions): generous, it catches a leak, not a byte.
BYTES_PER_ROW = 2_000
#: Pages of the (pKind, scheduledAt) index read per poll and per row delivered: a poll descends
#: the index to its range and stops at its end; a row's insert and lease each add an entry
#: (a descent of 3 levels here). ~4 here; a poll that does not stop at now walks every far
#: row of its kind (~100 per operation, 360 pages per poll).
PAGES_PER_OPERATION = 15.0


@pytest.mark.slow
def test_short_churn_delivers_each_row_once_and_polls_stop_at_now(
        database_url: str) -> None:
    cfg = SteadyConfig(database_url, SECONDS, RATE, far_rows=FAR_ROWS, sample_s=2.2)
    prepare(cfg)
    run = SteadyRun(cfg)
    samples = run.run()
    assert len(samples) >= 5, samples
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM delayed_queue WHERE \"pKind\" = %s",
                           [cfg.kind]).fetchone()
    assert row is not None
    left = int(row[0]) - FAR_ROWS  # produced at the very end, not polled yet
    assert run.produced > RATE * SECONDS / 2, run.produced  # a load, whatever the machine
    assert run.delivered == run.acked, "a row was delivered twice (its second ack found none)"
    assert run.acked + left == run.produced, (run.acked, left, run.produced)
    # The index pages the polls, inserts and leases read, after the first window (start-up,
    # the far rows' load).
    pages = samples[-1]["kind_index_pages"] - samples[0]["kind_index_pages"]
    polls = sum(s["polls"] for s in samples[1:])
    delivered = sum(s["delivered"] for s in samples[1:])
    assert polls > 100 and delivered > 100, samples
    assert pages <= PAGES_PER_OPERATION * (polls + delivered), (pages, polls, delivered)
    size = [s["table_bytes"] + s["index_bytes"] for s in samples]
    assert size[-1] - size[0] <= run.produced * BYTES_PER_ROW, size
