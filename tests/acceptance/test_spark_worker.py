"""Rows written by the Spark pipeline are run by a real ``celery worker`` at their ETA, once."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pytest

pytest.importorskip("pyspark", reason="the dev extra installs pyspark")

from pyspark.sql import DataFrame  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from delayq_transport import DelayedQueue  # noqa: E402
from delayq_transport.spark import schedule_tasks  # noqa: E402

from .conftest import executions, wait_until  # noqa: E402

pytestmark = pytest.mark.slow

ROWS = 20
#: ETAs lie 8-11 s ahead of the database clock at scheduling time: the Spark job (a few
#: seconds on a loaded CI box) finishes first, so the queue must hold them until due.
FIRST_ETA_S = 8.0
SPREAD_S = 3.0
#: A task may start up to this much before its ETA (clock rounding to the millisecond)...
EARLY_TOLERANCE_S = 0.05
#: ...and at most this much after it (worker wake-up; generous for a shared 2-core box).
LATE_TOLERANCE_S = 3.0


def test_worker_runs_spark_rows_at_their_eta(spark, database_url, start_worker):
    start_worker()
    with DelayedQueue(database_url, kind="celery") as queue:

        def users(base: datetime) -> DataFrame:
            step_ms = int(SPREAD_S * 1000 / (ROWS - 1))
            return spark.range(ROWS, numPartitions=2).select(
                F.concat(F.lit("spark-"), F.col("id").cast("string")).alias("tag"),
                (F.lit(base) + F.make_interval(secs=F.col("id") * step_ms / 1000)).alias("eta"),
            )

        # The same job into a table no worker reads: starts the Python workers and compiles
        # Spark's generated code, so the timed job below is a warm one.
        schedule_tasks(users(queue.now()), "celery_app.mark", "eta", args=["tag"], key="tag",
                       table="spark_warmup", database_url=database_url)
        now = queue.now()
        base = now + timedelta(seconds=FIRST_ETA_S)
        df = users(base)
        result = schedule_tasks(df, "celery_app.mark", "eta", args=["tag"], key="tag",
                                database_url=database_url)
        assert (result.created, result.bad) == (ROWS, 0)
        stored_by = queue.now()  # every row was inserted before this (database clock)
        # PySpark returns naive local datetimes: astimezone() reads them as such.
        due = {r.tag: r.eta.astimezone(now.tzinfo) for r in df.collect()}

        ran = wait_until(lambda: len(executions(database_url, "mark")) >= ROWS and
                         executions(database_url, "mark"), timeout=60,
                         message=f"{ROWS} Spark-scheduled tasks to run")
        wait_until(lambda: queue.count_waiting() == 0 and not _keys(database_url),
                   timeout=30, message="every row acked and deleted")

    assert len(executions(database_url, "mark")) == ROWS, "a task ran twice"
    assert Counter(r["task_id"] for r in ran) == Counter(list(due)), "each scheduled id ran once"
    for r in ran:
        tag = r["task_id"]
        assert r["arg"] == f'"{tag}"'
        assert datetime.fromisoformat(r["eta"]) == due[tag], "the worker saw the row's ETA"
        early = (due[tag] - r["ran_at"]).total_seconds()
        assert early <= EARLY_TOLERANCE_S, f"{tag} ran {early:.3f}s before its ETA"
        # Late only from when the row was both stored and due (a slow Spark job on a busy
        # box may finish after the first ETAs; those rows are due on arrival).
        late = (r["ran_at"] - max(due[tag], stored_by)).total_seconds()
        assert late <= LATE_TOLERANCE_S, f"{tag} ran {late:.3f}s late"
    held = sum(due[tag] > stored_by for tag in due)
    assert held > 0, "the Spark job outlasted every ETA: nothing tested holding until due"


def _keys(database_url: str) -> list[str]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return [r[0] for r in conn.execute('SELECT "pKey" FROM delayed_queue').fetchall()]
