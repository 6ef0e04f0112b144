"""``delayq spark-report``: the queue table read by Spark, as backlog/overdue/redelivery tables.

Imported by ``delayq`` when its command runs or the commands are listed (``LAZY_COMMANDS`` in
``delayq_transport.cli.main``), so this module must not import pyspark: only the command does,
and says which extra to install when it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from ..commands import Context, console, register
from ..output import emit, json_option

if TYPE_CHECKING:
    from .read import QueueReport


#: What the ``spark`` extra installs and the Spark modules import.
SPARK_EXTRA_MODULES = ("pyspark", "pyarrow", "pandas", "numpy")


def _spark_module() -> Any:
    try:
        from . import read, session  # noqa: F401  (imports pyspark and pyarrow)
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] not in SPARK_EXTRA_MODULES:
            raise
        raise click.ClickException(
            f"{exc.name} is not installed: pip install 'delayq[spark]'") from exc
    from .. import spark

    return spark


def _utc(value: datetime | None) -> str:
    """PySpark returns naive local datetimes; show them as UTC."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _table(title: str, columns: tuple[str, ...], rows: Sequence[tuple[Any, ...]]) -> Table:
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 or col in ("task", "due hour") else "right")
    for row in rows or [("(none)",) + ("-",) * (len(columns) - 1)]:
        table.add_row(*row)
    return table


def render(report: QueueReport, table_name: str) -> list[Table]:
    backlog = [(r.queue, _utc(r.due_hour), str(r.rows)) for r in report.backlog]
    late = [(r.queue, str(r.rows), _utc(r.oldest), f"{r.max_lag_s:.1f}") for r in report.overdue]
    again = [(r.queue, r.task or "-", str(r.rows), _utc(r.first_due)) for r in report.redeliveries]
    return [
        _table(f"Backlog of {table_name} by queue and due hour ({report.rows} rows)",
               ("queue", "due hour", "rows"), backlog),
        _table("Overdue (due, not picked up)", ("queue", "rows", "oldest due", "max lag s"), late),
        _table("Redeliveries", ("queue", "task", "rows", "first due"), again),
    ]


def document(report: QueueReport, table_name: str) -> dict[str, Any]:
    """What ``--json`` prints: the three reports' rows, instants in ISO-8601 UTC."""

    def row(r: Any) -> dict[str, Any]:
        return {k: v.astimezone(UTC).isoformat() if isinstance(v, datetime) else v
                for k, v in r.asDict().items()}

    return {"table": table_name, "rows": report.rows,
            "backlog": [row(r) for r in report.backlog],
            "overdue": [row(r) for r in report.overdue],
            "redeliveries": [row(r) for r in report.redeliveries]}


@click.command("spark-report")
@click.option("--master", default="local[2]", show_default=True,
              help="Spark master, used when no session is active in this process")
@click.option("--partitions", default=4, show_default=True, type=click.IntRange(1, 1024),
              help="Parallel range reads of the table")
@json_option
@click.pass_obj
def spark_report_cmd(obj: Context, master: str, partitions: int, as_json: bool) -> None:
    """Backlog per queue and due hour, overdue rows and redeliveries, computed with Spark."""
    spark_mod = _spark_module()
    obj.require_schema()  # a missing table is one clear line, not a JDBC error from Spark
    from pyspark.sql import SparkSession

    url = obj.require_url()
    active = SparkSession.getActiveSession()
    session = active or spark_mod.local_session("delayq-spark-report", master=master)
    try:
        df = spark_mod.queue_dataframe(session, url, obj.table, num_partitions=partitions)
        report = spark_mod.queue_report(df, datetime.now(UTC))
    finally:
        if active is None:  # never stop a session the caller owns
            session.stop()
    if as_json:
        emit(document(report, obj.table))
        return
    for table in render(report, obj.table):
        console.print(table)


register(spark_report_cmd)
