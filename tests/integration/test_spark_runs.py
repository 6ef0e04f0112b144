"""schedule_tasks(..., run_id=...): a run is applied once, even after its tasks ran (issue 29).

Rows deleted with ``purge`` stand for tasks a worker ran and acked (the acceptance test
``test_spark_worker.py`` does it with a real worker): the keys alone no longer protect them.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import psycopg
import pyspark  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import pytest
from pyspark import TaskContext  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from delayq_transport import DelayedQueue  # noqa: E402
from delayq_transport.core import DatabaseError, InvalidInput, RunMismatch  # noqa: E402
from delayq_transport.spark import schedule_tasks  # noqa: E402

pytestmark = pytest.mark.slow

TASK = "celery_app.mark"


def users(spark: SparkSession, n: int, partitions: int, float_arg: bool = False) -> DataFrame:
    """Fixed ETAs a day ahead; every 10th email holds a control character, so those rows are
    encoded by the partition's Python encoder, the others in the JVM (or, with ``float_arg``,
    every row by the Python UDF)."""
    base = datetime(2030, 1, 1, tzinfo=UTC)
    email = F.concat(F.lit("user"), F.col("id").cast("string"),
                     F.when(F.col("id") % 10 == 0, F.lit("\x01")).otherwise(F.lit("")))
    df = spark.range(n, numPartitions=partitions).select(
        F.col("id").alias("user_id"),
        (F.lit(base) + F.make_interval(secs=F.col("id"))).alias("eta"), email.alias("email"))
    return df.withColumn("score", F.col("user_id") / 2) if float_arg else df


def schedule(df: DataFrame, url: str, **options: object):
    args = ["user_id", "score"] if "score" in df.columns else ["user_id"]
    return schedule_tasks(df, TASK, "eta", args=args, kwargs={"email": "email"},
                          database_url=url, **options)


def ledger(url: str, run_id: str) -> dict[int, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute('SELECT "part", "rows" FROM delayed_queue__runs WHERE "runId" = %s',
                            (run_id,)).fetchall()
    return {int(p): int(n) for p, n in rows}


def waiting(url: str) -> int:
    with DelayedQueue(url, kind="celery") as q:
        return q.count_waiting()


def ran(url: str) -> int:
    """Delete every waiting row, as a worker running and acking them would."""
    with DelayedQueue(url, kind="celery") as q:
        return q.purge()


@pytest.mark.parametrize("float_arg", [False, True], ids=["jvm", "python-udf"])
def test_rerun_of_a_run_id_adds_nothing_after_its_tasks_ran(spark, database_url, float_arg):
    df = users(spark, 1_000, partitions=4, float_arg=float_arg)
    first = schedule(df, database_url, run_id="nightly-1")
    assert (first.created, first.skipped, first.bad) == (1_000, 0, 0)
    assert ledger(database_url, "nightly-1") == {-1: 1_000, 0: 250, 1: 250, 2: 250, 3: 250}
    assert ran(database_url) == 1_000

    again = schedule(df.repartition(3), database_url, run_id="nightly-1")
    assert (again.created, again.ignored, again.skipped, again.bad) == (0, 0, 1_000, 0), \
        "a run recorded whole is skipped whatever its split"
    assert waiting(database_url) == 0

    # Without a run id only the keys protect a re-run: the tasks that ran are scheduled again.
    plain = schedule(df, database_url)
    assert (plain.created, plain.skipped) == (1_000, 0)


def _partly_applied(spark: SparkSession, url: str, run_id: str) -> DataFrame:
    """Partition 1 fails on every attempt once partition 0 is recorded: the job fails with
    partition 0 applied (and, here, run); returns the same input without the failure."""
    clean = users(spark, 2_000, partitions=2)

    def fail_partition_1(user_id: int) -> int:
        ctx = TaskContext.get()
        if ctx.partitionId() == 1:
            deadline = time.monotonic() + 60
            with psycopg.connect(url, autocommit=True) as conn:
                while not conn.execute('SELECT 1 FROM delayed_queue__runs WHERE "runId" = %s '
                                       'AND "part" = 0', (run_id,)).fetchone():
                    assert time.monotonic() < deadline, "partition 0 was never recorded"
                    time.sleep(0.05)
            raise RuntimeError("injected failure of partition 1")
        return user_id

    flaky = clean.withColumn("user_id", F.udf(fail_partition_1, "long")("user_id"))
    with pytest.raises(DatabaseError, match="injected failure of partition 1") as failed:
        schedule(flaky, url, run_id=run_id)
    assert f"re-running with the same run_id {run_id!r}" in str(failed.value)
    assert ledger(url, run_id) == {0: 1_000}, "only the partition that committed is recorded"
    assert ran(url) == 1_000
    return clean


def test_partly_applied_run_resumes_part_by_part(spark, database_url):
    clean = _partly_applied(spark, database_url, "import-7")
    resumed = schedule(clean, database_url, run_id="import-7")
    assert (resumed.created, resumed.ignored, resumed.skipped, resumed.bad) == (1_000, 0, 1_000, 0)
    assert waiting(database_url) == 1_000, "only partition 1's rows were written"
    assert ledger(database_url, "import-7") == {-1: 2_000, 0: 1_000, 1: 1_000}


def test_partly_applied_run_split_otherwise_is_refused_before_writing(spark, database_url):
    clean = _partly_applied(spark, database_url, "import-8")
    other_splits = [clean.coalesce(1),  # part 0 is now part of a larger partition
                    clean.repartition(2, "user_id"),  # same count, other rows per partition
                    clean.where(F.col("user_id") != 3)]  # the input changed
    for df in other_splits:
        with pytest.raises(RunMismatch, match=r"'import-8' was partly applied.*\[0\]"):
            schedule(df, database_url, run_id="import-8")
    assert waiting(database_url) == 0, "nothing was written"
    assert ledger(database_url, "import-8") == {0: 1_000}


def test_run_options_are_checked_on_the_driver(spark, database_url):
    df = users(spark, 10, partitions=1)
    for run_id, problem in (("", "run_id must be a non-empty str"), ("x" * 201, "limit is 200"),
                            (7, "run_id must be a non-empty str")):
        with pytest.raises(InvalidInput, match=problem):
            schedule(df, database_url, run_id=run_id)
    with pytest.raises(InvalidInput, match="run_retention must be positive"):
        schedule(df, database_url, run_id="r", run_retention=0)
    assert waiting(database_url) == 0


def test_each_run_prunes_entries_older_than_its_retention(spark, database_url):
    df = users(spark, 10, partitions=2)
    schedule(df, database_url, run_id="old")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute('UPDATE delayed_queue__runs SET "appliedAt" = "appliedAt" - %s',
                     (int(timedelta(days=3).total_seconds() * 1000),))
    schedule(df, database_url, run_id="new", run_retention=timedelta(days=4))
    assert ledger(database_url, "old") == {-1: 10, 0: 5, 1: 5}, "younger than 4 days: kept"
    schedule(df, database_url, run_id="newer", run_retention=timedelta(days=2))
    assert ledger(database_url, "old") == {}, "older than 2 days: pruned"
    assert ledger(database_url, "new") == {-1: 10, 0: 5, 1: 5}
