"""A ``schedule_stream`` driver process for test_spark_worker.py (issue 29).

``python spark_stream_driver.py DATABASE_URL SOURCE_DIR CHECKPOINT [CRASH_AFTER_BATCH]``:
a file-source query (one JSON file per micro-batch) keyed by event id. With
``CRASH_AFTER_BATCH``, ``on_batch`` of that batch (stored, not yet committed to the
checkpoint) waits until the worker has run every task scheduled so far, then kills the whole
driver with ``os._exit``: no ``finally``, no Spark shutdown, as a lost driver. Prints one JSON
line per batch and, when the query ends, one with the totals.
"""

from __future__ import annotations

import json
import os
import sys
import time

import psycopg

from delayq_transport.spark import ScheduleResult, local_session, schedule_stream

CRASH_EXIT = 3
RAN_TIMEOUT_S = 60.0


def executions(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM executions").fetchone()
    return int(row[0]) if row else 0


def main(url: str, source: str, checkpoint: str, crash_after: int | None) -> None:
    spark = local_session("delayq-stream-driver")
    spark.sparkContext.setLogLevel("ERROR")
    scheduled = [0]

    def on_batch(batch_id: int, result: ScheduleResult) -> None:
        scheduled[0] += result.created
        print(json.dumps({"batch": batch_id, "created": result.created,
                          "ignored": result.ignored, "skipped": result.skipped}), flush=True)
        if batch_id == crash_after:
            deadline = time.monotonic() + RAN_TIMEOUT_S
            while executions(url) < scheduled[0]:  # the worker ran what this driver stored
                if time.monotonic() > deadline:
                    raise AssertionError(f"the worker ran {executions(url)} of {scheduled[0]}")
                time.sleep(0.05)
            os._exit(CRASH_EXIT)

    stream = (spark.readStream.schema("event_id string, user_id long, eta timestamp")
              .option("maxFilesPerTrigger", 1).json(source))
    handle = schedule_stream(stream, "celery_app.mark", "eta", args=["user_id"],
                             key="event_id", database_url=url, checkpoint_location=checkpoint,
                             trigger={"availableNow": True}, on_batch=on_batch)
    assert handle.query is not None
    handle.query.awaitTermination()
    print(json.dumps({"batches": handle.batches, "created": handle.created,
                      "ignored": handle.ignored, "skipped": handle.skipped}), flush=True)
    spark.stop()


if __name__ == "__main__":
    crash = int(sys.argv[4]) if len(sys.argv) > 4 else None
    main(sys.argv[1], sys.argv[2], sys.argv[3], crash)
