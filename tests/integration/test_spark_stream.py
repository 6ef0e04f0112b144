"""schedule_stream: a file-source query killed after a micro-batch was stored but before it
was committed, then restarted from its checkpoint: nothing is lost, nothing is doubled."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pyspark  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import pytest

from delayq_transport.core import InvalidInput  # noqa: E402
from delayq_transport.spark import schedule_stream  # noqa: E402

pytestmark = pytest.mark.slow

ROWS_PER_FILE = 100
TIMEOUT_S = 180


def _rows(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM delayed_queue").fetchone()
    assert row is not None
    return int(row[0])


def _drop_file(src: Path, n: int, base: datetime) -> None:
    """One file of users; written aside, then renamed in (the file source must not see it half
    written)."""
    lines = [json.dumps({"user_id": n * ROWS_PER_FILE + i,
                         "eta": (base + timedelta(seconds=i)).isoformat()})
             for i in range(ROWS_PER_FILE)]
    tmp = src.parent / f"part-{n}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(src / f"part-{n}.json")


def test_restart_from_checkpoint_mid_stream(spark, database_url, tmp_path):
    src, checkpoint = tmp_path / "in", str(tmp_path / "checkpoint")
    src.mkdir()
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
    for n in range(3):
        _drop_file(src, n, base)

    def start(on_batch=None):
        stream = (spark.readStream.schema("user_id long, eta timestamp")
                  .option("maxFilesPerTrigger", 1).json(str(src)))
        return schedule_stream(stream, "app.remind", "eta", args=["user_id"],
                               database_url=database_url, checkpoint_location=checkpoint,
                               trigger={"availableNow": True}, on_batch=on_batch)

    def crash_after_second_batch(batch_id: int, result: object) -> None:
        if batch_id == 1:  # stored, not yet committed to the checkpoint
            raise RuntimeError("injected crash")

    first = start(crash_after_second_batch)
    assert first.query is not None
    with pytest.raises(Exception, match="injected crash"):
        first.query.awaitTermination(TIMEOUT_S)
    assert (first.created, first.batches) == (2 * ROWS_PER_FILE, 2)
    assert _rows(database_url) == 2 * ROWS_PER_FILE

    _drop_file(src, 3, base)  # arrives while the query is down
    second = start()
    assert second.query is not None
    second.query.awaitTermination(TIMEOUT_S)
    assert second.query.exception() is None
    # Batch 1 replayed (recorded in the run ledger: skipped, nothing written), then files 2, 3.
    assert (second.skipped, second.ignored, second.created, second.bad) == (
        ROWS_PER_FILE, 0, 2 * ROWS_PER_FILE, 0)
    assert _rows(database_url) == 4 * ROWS_PER_FILE


def test_stream_refuses_batch_frames_and_missing_checkpoint(spark, database_url):
    df = spark.range(3)
    with pytest.raises(InvalidInput, match="streaming DataFrame"):
        schedule_stream(df, "t", 60, database_url=database_url, checkpoint_location="/tmp/x")
    stream = spark.readStream.format("rate").load()
    with pytest.raises(InvalidInput, match="checkpoint_location"):
        schedule_stream(stream, "t", 60, database_url=database_url, checkpoint_location="")
