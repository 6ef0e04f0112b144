"""Remind every user 3 days before their plan renews: Celery tasks scheduled from Spark.

One command (PostgreSQL URL of any database; the table is created on first use)::

    python3 examples/spark_reminders.py --database-url postgresql://postgres@127.0.0.1:5432/test \
        --users 10000

It builds a DataFrame of users and renewal dates (as a warehouse query would), schedules
``spark_reminders_app.remind(user_id, email, renewal_date)`` at 09:00 UTC three days before
each renewal, and prints what happened and the resulting backlog. Run it twice: the second run
adds nothing (keys are ``renewal-reminder/<user>/<date>``). Users whose reminder time has
already passed are reported as bad rows (``past_eta="skip"``), not silently dropped. A worker
runs the reminders when due::

    cd examples && DELAYQ_BROKER_URL=delayq+postgresql://postgres@127.0.0.1:5432/test \
        celery -A spark_reminders_app worker -l INFO
"""

from __future__ import annotations

import click
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

from delayq_transport.spark import (
    ScheduleResult,
    backlog_by_hour,
    local_session,
    queue_dataframe,
    schedule_tasks,
)

TASK = "spark_reminders_app.remind"
QUEUE = "reminders"
console = Console()


def users(spark: SparkSession, n: int, partitions: int) -> DataFrame:
    """Users with renewals spread over the next 60 days (a few are due within 3 days)."""
    offset_days = F.pmod(F.xxhash64("id"), F.lit(60)).cast("int") - 2
    return spark.range(n, numPartitions=partitions).select(
        F.col("id").alias("user_id"),
        F.concat(F.lit("user"), F.col("id").cast("string"), F.lit("@example.com")).alias("email"),
        F.date_add(F.current_date(), offset_days).alias("renewal_date"),
    )


def reminders(df: DataFrame, database_url: str, days_before: int) -> ScheduleResult:
    # The session runs in UTC (local_session), so the date cast is midnight UTC.
    remind_at = (F.date_sub("renewal_date", days_before).cast("timestamp")
                 + F.expr("INTERVAL 9 HOURS"))
    key = F.concat_ws("/", F.lit("renewal-reminder"), F.col("user_id").cast("string"),
                      F.col("renewal_date").cast("string"))
    return schedule_tasks(
        df, TASK, remind_at, args=["user_id", "email", "renewal_date"], key=key, queue=QUEUE,
        past_eta="skip", database_url=database_url,
    )


def show(result: ScheduleResult) -> None:
    table = Table(title=f"schedule_tasks: {result.total} rows in {result.elapsed_s:.1f}s "
                        f"({result.rows_per_s:,.0f} rows/s)")
    for col in ("created", "updated", "ignored", "bad"):
        table.add_column(col, justify="right")
    table.add_row(*(f"{getattr(result, c):,}" for c in ("created", "updated", "ignored", "bad")))
    console.print(table)
    for bad in result.bad_sample[:3]:
        console.print(f"  bad row {bad.row}: [yellow]{bad.reason}[/yellow]")


def show_backlog(spark: SparkSession, database_url: str, limit: int) -> None:
    df = queue_dataframe(spark, database_url).where(F.col("queue") == QUEUE)
    by_day = (backlog_by_hour(df).groupBy(F.to_date("due_hour").alias("day"))
              .agg(F.sum("rows").alias("reminders")).orderBy("day").limit(limit).collect())
    table = Table(title=f"{QUEUE} backlog, first {limit} days")
    table.add_column("day")
    table.add_column("reminders", justify="right")
    for row in by_day:
        table.add_row(str(row.day), f"{row.reminders:,}")
    console.print(table)


@click.command()
@click.option("--database-url", envvar="DELAYQ_DATABASE_URL", required=True,
              help="postgresql://user@host:port/db (env: DELAYQ_DATABASE_URL)")
@click.option("--users", "n_users", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--days-before", default=3, show_default=True, type=click.IntRange(0))
@click.option("--partitions", default=4, show_default=True, type=click.IntRange(1))
@click.option("--master", default="local[2]", show_default=True)
def main(database_url: str, n_users: int, days_before: int, partitions: int, master: str) -> None:
    """Schedule renewal reminders for N users, then print the queue's backlog."""
    spark = local_session("delayq-spark-reminders", master=master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        show(reminders(users(spark, n_users, partitions), database_url, days_before))
        show_backlog(spark, database_url, limit=7)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
