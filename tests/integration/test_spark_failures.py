"""Clear failures of the Spark pipeline (issue 13): workers that cannot import delayq, a
database the executors cannot reach, and ETAs that would give every run new keys."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyspark  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import pytest
from _spark_env import worker_env
from pyspark.sql import functions as F  # noqa: E402

from delayq_transport.core import DatabaseUnavailable  # noqa: E402
from delayq_transport.spark import (  # noqa: E402
    ExecutorEnvironmentError,
    UnstableEta,
    schedule_tasks,
)

pytestmark = pytest.mark.slow


def _rows(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM delayed_queue").fetchone()
    assert row is not None
    return int(row[0])


def test_workers_that_cannot_import_delayq_name_their_interpreter(spark, database_url,
                                                                  tmp_path: Path):
    # What a virtualenv run without activating it looks like: the workers' python lacks kombu.
    (tmp_path / "kombu.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'kombu'\", name='kombu')\n")
    with worker_env(spark, PYTHONPATH=str(tmp_path)), \
            pytest.raises(ExecutorEnvironmentError) as failed:
        schedule_tasks(spark.range(10), "t", 60, args=["id"], database_url=database_url)
    text = str(failed.value)
    assert "No module named 'kombu'" in text and "python" in text
    assert "PYSPARK_PYTHON=" in text and "spark.pyspark.python" in text
    assert _rows(database_url) == 0


def test_database_unreachable_from_executors_fails_before_any_write(spark, database_url):
    # The driver connects; executors insist on TLS, which the test server does not offer.
    with worker_env(spark, PGSSLMODE="require"), pytest.raises(DatabaseUnavailable) as failed:
        schedule_tasks(spark.range(1000, numPartitions=4), "t", 60, args=["id"],
                       database_url=database_url)
    assert "executors cannot reach the database" in str(failed.value)
    assert _rows(database_url) == 0


def test_eta_from_the_clock_without_key_is_refused(spark, database_url):
    df = spark.range(100).withColumn("eta", F.current_timestamp() + F.expr("INTERVAL 1 HOUR"))
    with pytest.raises(UnstableEta, match="current_timestamp"):
        schedule_tasks(df, "t", "eta", args=["id"], database_url=database_url)
    assert _rows(database_url) == 0
    # With a key the job is idempotent again: a second run adds nothing.
    runs = [schedule_tasks(df, "t", "eta", args=["id"], key=F.col("id").cast("string"),
                           database_url=database_url) for _ in range(2)]
    assert [(r.created, r.ignored) for r in runs] == [(100, 0), (0, 100)]
    # A countdown is keyed as such: stable across runs without a key.
    again = [schedule_tasks(df, "t2", 3600, args=["id"], database_url=database_url)
             for _ in range(2)]
    assert [(r.created, r.ignored) for r in again] == [(100, 0), (0, 100)]
    assert _rows(database_url) == 200
