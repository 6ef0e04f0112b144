"""The Spark pipeline against real PostgreSQL, in Spark local mode (one session for the file).

Covers issue 5: 100,000 rows scheduled and counted, re-runs and task retries add nothing,
on_conflict="update", bad rows counted with a sample, an unreachable database failing before
any partition starts, and queue_dataframe + the report helpers giving the numbers we planted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pyspark  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import pytest
from _tables import rich_tables, row_cells
from pyspark import TaskContext  # noqa: E402
from pyspark.sql import DataFrame, Row, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from delayq_transport import DelayedQueue  # noqa: E402
from delayq_transport.core import DatabaseUnavailable, InvalidInput  # noqa: E402
from delayq_transport.formats import celery as message  # noqa: E402
from delayq_transport.spark import (  # noqa: E402
    PastEta,
    _partition_failure,
    backlog_by_hour,
    default_key,
    id_ranges,
    overdue,
    queue_dataframe,
    queue_report,
    redeliveries,
    schedule_tasks,
    uuid5,
)

pytestmark = pytest.mark.slow

TASK = "celery_app.mark"


def rows_in_table(database_url: str, table: str = "delayed_queue") -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    assert row is not None
    return int(row[0])


def users(spark: SparkSession, n: int, base: datetime, partitions: int = 4) -> DataFrame:
    """n users, user i due at base + i seconds (fixed ETAs, so re-runs derive the same keys)."""
    return spark.range(n, numPartitions=partitions).select(
        F.col("id").alias("user_id"),
        (F.lit(base) + F.make_interval(secs=F.col("id"))).alias("eta"),
        F.concat(F.lit("user"), F.col("id").cast("string"), F.lit("@example.com")).alias("email"),
    )


def future_base(days: int = 1) -> datetime:
    return datetime.now(UTC).replace(microsecond=0) + timedelta(days=days)


def schedule_users(df: DataFrame, database_url: str, **options: object):
    return schedule_tasks(df, TASK, "eta", args=["user_id"], kwargs={"email": "email"},
                          database_url=database_url, **options)


# -- scheduling ----------------------------------------------------------------------------


def test_100k_rows_scheduled_counted_and_rerun_adds_none(spark, database_url):
    base = future_base()
    df = users(spark, 100_000, base)
    first = schedule_users(df, database_url)
    assert (first.created, first.updated, first.ignored, first.bad) == (100_000, 0, 0, 0)
    assert rows_in_table(database_url) == 100_000

    again = schedule_users(df, database_url)
    assert (again.created, again.updated, again.ignored, again.bad) == (0, 0, 100_000, 0)
    assert rows_in_table(database_url) == 100_000


def test_rows_are_celery_messages_keyed_by_content(spark, database_url):
    base = future_base()
    schedule_users(users(spark, 3, base, partitions=1), database_url)
    with DelayedQueue(database_url, kind="celery") as q:
        eta = base + timedelta(seconds=2)
        key = default_key(TASK, [2], {"email": "user2@example.com"}, int(eta.timestamp() * 1000))
        stored = q.get(key)
    assert stored is not None and stored.scheduled_at == eta
    msg = message.decode(stored.payload)
    assert msg["headers"]["task"] == TASK and msg["headers"]["id"] == key
    assert datetime.fromisoformat(msg["headers"]["eta"]) == eta
    body = json.loads(__import__("base64").b64decode(msg["body"]))
    assert body[0] == [2] and body[1] == {"email": "user2@example.com"}
    assert msg["properties"]["delivery_info"]["routing_key"] == "celery"


def test_key_column_priority_and_countdown(spark, database_url):
    df = spark.createDataFrame([Row(uid=i, name=f"n{i}") for i in range(10)])
    started = datetime.now(UTC)
    result = schedule_tasks(df, TASK, timedelta(minutes=5), args=["name"], key=F.concat(
        F.lit("remind/"), F.col("uid").cast("string")), queue="mail", priority=7,
        database_url=database_url)
    assert result.created == 10
    with DelayedQueue(database_url, kind=message.kind_for("mail", 7)) as q:
        stored = q.get("remind/3")
        assert stored is not None and stored.kind == "mail\x06\x166"
        lead = (stored.scheduled_at - started).total_seconds()
        assert 299 < lead < 301 + 30, lead
    # Without a key column a countdown is hashed as such: a re-run (later, so another "now")
    # derives the same keys, the first ETAs stay and nothing is added.
    runs = [schedule_tasks(df, TASK, 300, args=["name"], queue="mail", database_url=database_url)
            for _ in range(2)]
    assert [(r.created, r.ignored) for r in runs] == [(10, 0), (0, 10)]


def test_spark_task_retry_creates_no_duplicates(spark, database_url):
    """Partition 0's first attempt dies after its writer merged rows; Spark retries it."""
    df = users(spark, 20_000, future_base(), partitions=2)

    def wait_for_rows(n: int, timeout_s: float = 60.0) -> None:
        # Nested: executors unpickle this closure and cannot import the test module.
        deadline = time.monotonic() + timeout_s
        with psycopg.connect(database_url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                if conn.execute("SELECT count(*) FROM delayed_queue").fetchone()[0] >= n:
                    return
                time.sleep(0.05)
        raise AssertionError(f"the writer did not store {n} rows in {timeout_s} s")

    def fail_first_attempt(user_id: int) -> int:
        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and user_id == 8_000:
            wait_for_rows(1_000)  # the writer downstream has merged rows
            raise RuntimeError("injected executor failure")
        return user_id

    flaky = df.withColumn("user_id", F.udf(fail_first_attempt, "long")("user_id"))
    # Small Arrow batches and merges, so the writer has merged rows when the failure hits.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        result = schedule_users(flaky, database_url, chunk_size=200)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert result.created + result.ignored == 20_000 and result.bad == 0
    assert result.ignored > 0, "the failed attempt wrote rows that the retry found"
    assert rows_in_table(database_url) == 20_000


def test_on_conflict_update_replaces_in_place(spark, database_url):
    base = future_base()
    df = users(spark, 500, base, partitions=2).withColumn("key", F.concat(F.lit("u/"), "user_id"))
    assert schedule_users(df, database_url, key="key").created == 500

    later = df.withColumn("eta", F.col("eta") + F.expr("INTERVAL 1 HOUR"))
    kept = schedule_users(later, database_url, key="key")  # on_conflict="ignore"
    assert (kept.created, kept.ignored) == (0, 500)
    moved = schedule_users(later, database_url, key="key", on_conflict="update")
    assert (moved.created, moved.updated, moved.ignored) == (0, 500, 0)
    same = schedule_users(later, database_url, key="key", on_conflict="update")
    assert (same.updated, same.ignored) == (0, 500), "unchanged rows are not rewritten"
    assert rows_in_table(database_url) == 500
    with DelayedQueue(database_url, kind="celery") as q:
        stored = q.get("u/5")
    assert stored is not None and stored.scheduled_at == base + timedelta(hours=1, seconds=5)


# -- bad rows --------------------------------------------------------------------------------


def mixed_rows(spark: SparkSession) -> DataFrame:
    from pyspark.ml.linalg import Vectors, VectorUDT

    future = datetime.now(UTC) + timedelta(hours=1)
    past = datetime.now(UTC) - timedelta(hours=1)
    rows = [
        Row(name="good1", eta=future, key="k1", vec=None),
        Row(name="good2", eta=future, key="k2", vec=None),
        Row(name="null-eta", eta=None, key="k3", vec=None),
        Row(name="vector-arg", eta=future, key="k4", vec=Vectors.dense([1.0, 2.0])),
        Row(name="long-key", eta=future, key="x" * 250, vec=None),
        Row(name="past", eta=past, key="k6", vec=None),
    ]
    schema = T.StructType([T.StructField("name", T.StringType()),
                           T.StructField("eta", T.TimestampType()),
                           T.StructField("key", T.StringType()),
                           T.StructField("vec", VectorUDT())])
    return spark.createDataFrame(rows, schema)


def test_bad_rows_counted_with_reasons_never_dropped(spark, database_url):
    result = schedule_tasks(mixed_rows(spark), TASK, "eta", args=["name", "vec"], key="key",
                            past_eta="skip", database_url=database_url)
    assert (result.created, result.bad) == (2, 4)
    reasons = {b.row["key"].strip("'")[:10]: b.reason for b in result.bad_sample}
    assert reasons["k3"] == "eta is null"
    assert "not JSON-serialisable" in reasons["k4"] and "DenseVector" in reasons["k4"]
    assert "250 characters, the limit is 200" in reasons["x" * 10]
    assert "in the past (past_eta='skip')" in reasons["k6"]
    assert rows_in_table(database_url) == 2


def test_past_eta_run_stores_and_error_refuses_everything(spark, database_url):
    df = mixed_rows(spark).where(F.col("vec").isNull() & (F.length("key") < 10))
    with pytest.raises(PastEta) as refused:
        schedule_tasks(df, TASK, "eta", args=["name"], key="key", past_eta="error",
                       database_url=database_url)
    assert refused.value.count == 1 and "k6" in refused.value.sample[0].row["key"]
    assert rows_in_table(database_url) == 0

    ran = schedule_tasks(df, TASK, "eta", args=["name"], key="key", past_eta="run",
                         database_url=database_url)
    assert (ran.created, ran.bad) == (3, 1)  # the past row is stored (due now); null ETA is bad


def test_unreachable_database_fails_before_any_partition(spark):
    sc = spark.sparkContext
    sc.setJobGroup("unreachable-db", "schedule_tasks against a closed port")
    try:
        with pytest.raises(DatabaseUnavailable, match="unreachable"):
            schedule_users(users(spark, 100, future_base()),
                           "postgresql://postgres@127.0.0.1:1/nowhere")
        assert sc.statusTracker().getJobIdsForGroup("unreachable-db") == []
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"on_conflict": "replace"}, "on_conflict"),
        ({"past_eta": "later"}, "past_eta"),
        ({"priority": 12}, "priority"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"table": "bad-name"}, "table name"),
        ({"eta": "no_such_column"}, "no_such_column"),
        ({"eta": "user_id"}, "eta column has type bigint"),
        ({"eta": -5}, "must not be negative"),
    ],
)
def test_bad_options_rejected_on_driver(spark, database_url, options, problem):
    call = {"eta": "eta", **options}
    with pytest.raises(InvalidInput, match=problem):
        schedule_tasks(users(spark, 10, future_base()), TASK, call.pop("eta"),
                       database_url=database_url, **call)
    assert rows_in_table(database_url) == 0


def test_partition_failure_surfaces_the_delayq_error():
    raised = RuntimeError("Traceback ...\ndelayq_transport.core.db.errors.DatabaseUnavailable: "
                          "database postgresql://x unreachable: connection refused\n")
    err = _partition_failure(raised)
    assert isinstance(err, DatabaseUnavailable) and "connection refused" in str(err)


def test_helpers_are_exact():
    import uuid

    from delayq_transport.spark import KEY_NAMESPACE

    assert uuid5("héllo") == str(uuid.uuid5(KEY_NAMESPACE, "héllo"))
    assert id_ranges(1, 11, 3) == [(1, 5), (5, 8), (8, 11)]
    assert id_ranges(5, 7, 4) == [(5, 6), (6, 7)]


# -- reading back --------------------------------------------------------------------------


def test_queue_dataframe_and_reports(spark, database_url):
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    later = spark.range(300, numPartitions=2).select(
        F.col("id").alias("n"),
        F.when(F.col("id") < 100, F.lit(hour + timedelta(hours=2, minutes=10)))
         .otherwise(F.lit(hour + timedelta(hours=3, minutes=20))).alias("eta"))
    assert schedule_tasks(later, "t.later", "eta", args=["n"], queue="a",
                          database_url=database_url).created == 300
    long_ago = hour - timedelta(days=2) + timedelta(minutes=5)
    late = spark.range(50).select(F.col("id").alias("n"), F.lit(long_ago).alias("eta"))
    assert schedule_tasks(late, "t.late", "eta", args=["n"], queue="b", priority=6,
                          database_url=database_url).created == 50

    with DelayedQueue(database_url, kind=message.kind_for("b", 6)) as q:
        taken = q.try_poll_many(10)
        assert len(taken) == 10
        assert q.release(taken[:5]) == 5  # 5 in flight, 5 redelivered and due again

    # One read for every assertion below (in_flight/redelivered are as of that read).
    df = queue_dataframe(spark, database_url, num_partitions=3, page_rows=37).cache()
    assert df.count() == 350 and df.select("id").distinct().count() == 350
    b_rows = df.where(F.col("queue") == "b").collect()
    assert {(r.kind, r.priority, r.task) for r in b_rows} == {("b\x06\x166", 6, "t.late")}
    assert sum(r.in_flight for r in b_rows) == 5 and sum(r.redelivered for r in b_rows) == 5

    # PySpark hands timestamps back as naive local times: astimezone() reads them as such.
    backlog = {(r.queue, r.due_hour.astimezone(UTC)): r.rows
               for r in backlog_by_hour(df).collect()}
    assert backlog[("a", hour + timedelta(hours=2))] == 100
    assert backlog[("a", hour + timedelta(hours=3))] == 200
    assert backlog[("b", hour - timedelta(days=2))] == 40
    assert sum(v for (qn, _), v in backlog.items() if qn == "b") == 45

    late_rows = {r.queue: r for r in overdue(df).collect()}
    assert set(late_rows) == {"b"} and late_rows["b"].rows == 45
    assert late_rows["b"].max_lag_s > 2 * 86400 - 3600
    # As seen from three hours ahead, queue a's first hour is overdue too.
    ahead = {r.queue: r.rows for r in overdue(df, hour + timedelta(hours=3)).collect()}
    assert ahead == {"a": 100, "b": 45}
    assert [(r.queue, r.task, r.rows) for r in redeliveries(df).collect()] == [("b", "t.late", 5)]

    report = queue_report(df)
    assert report.rows == 350 and len(report.overdue) == 1 and len(report.redeliveries) == 1


def test_queue_dataframe_of_empty_table(spark, database_url):
    df = queue_dataframe(spark, database_url)
    assert df.count() == 0 and "scheduled_at" in df.columns


def test_spark_report_cli(spark, database_url):
    from click.testing import CliRunner

    from delayq_transport.cli import main

    late = spark.range(7).select(F.col("id").alias("n"),
                                 F.lit(datetime.now(UTC) - timedelta(hours=1)).alias("eta"))
    schedule_tasks(late, "t.cli", "eta", args=["n"], queue="reports", database_url=database_url)
    out = CliRunner().invoke(main, ["-d", database_url, "spark-report", "--partitions", "2"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    tables = rich_tables(out.output)
    assert len(tables) == 3, out.output  # backlog, overdue, redeliveries
    assert row_cells(out.output, "reports", table=0)["rows"] == ["7"], out.output
    late = row_cells(out.output, "reports", table=1)
    assert late["rows"] == ["7"] and float(late["max lag s"][0]) >= 3600, out.output
    assert [r[0] for r in tables[1][1]] == ["reports"], out.output  # no other queue overdue
    assert [r[0] for r in tables[2][1]] == ["(none)"], out.output  # nothing redelivered
    assert not spark.sparkContext._jsc.sc().isStopped(), "the report must not stop our session"


def test_cli_imports_without_pyspark():
    probe = (
        "import sys; sys.modules['pyspark'] = None\n"
        "from click.testing import CliRunner\n"
        "from delayq_transport.cli import main\n"
        "import click; assert 'spark-report' in main.list_commands(click.Context(main))\n"
        "r = CliRunner().invoke(main, ['-d', 'postgresql://x@127.0.0.1/x', 'spark-report'])\n"
        "print(r.exit_code, r.output)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1 ") and "delayq[spark]" in out.stdout
