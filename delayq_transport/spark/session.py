"""Spark sessions for delayq, and the check that executors can run a partition at all.

A partition needs an interpreter that imports delayq (and pyarrow) and a route to the
database. Both fail late and obscurely otherwise: ``ModuleNotFoundError: No module named
'kombu'`` in every task when Spark starts its workers with another ``python3`` than the driver's,
or a connection error after other partitions already wrote. :func:`check_executors` runs one
tiny job first and turns either into one error that says what to do.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from ..core import DatabaseUnavailable, DelayqError
from ..core.db import mask_password

#: Local-mode defaults for CLI, tests, examples and benches: no UI, few shuffle partitions,
#: UTC so hour buckets read the same on every machine.
LOCAL_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
    "spark.sql.chunkBase64String.enabled": "false",
}

#: Runs on the executors. Defined from source so cloudpickle ships it by value: unpickling it
#: must not need delayq, which is exactly what may be missing there.
_PROBE_SOURCE = '''
def probe(urls):
    import sys
    found = {"python": sys.executable, "version": sys.version.split()[0],
             "import_error": None, "db_error": None}
    try:
        import pyarrow  # noqa: F401
        import delayq_transport.spark.rows  # noqa: F401  (kombu, psycopg, the encoder)
    except Exception as exc:
        found["import_error"] = f"{type(exc).__name__}: {exc}"
        return [found]
    import psycopg
    for url in urls:
        try:
            psycopg.connect(url, connect_timeout=10).close()
        except Exception as exc:
            found["db_error"] = str(exc).strip()
    return [found]
'''


class ExecutorEnvironmentError(DelayqError):
    """Spark's Python workers cannot import delayq (or run Python at all)."""


def _probe_function() -> Any:
    namespace: dict[str, Any] = {"__name__": "delayq_executor_probe"}
    exec(compile(_PROBE_SOURCE, "<delayq executor probe>", "exec"), namespace)  # noqa: S102
    return namespace["probe"]


def check_executors(spark: SparkSession, database_url: str) -> None:
    """One task per default slot: can the workers import delayq and reach the database?"""
    sc = spark.sparkContext
    slots = max(1, min(sc.defaultParallelism, 8))
    try:
        found = sc.parallelize([database_url] * slots, slots).mapPartitions(
            _probe_function()).collect()
    except Exception as exc:
        raise ExecutorEnvironmentError(
            f"Spark could not run a Python task: {_last_line(exc)}. {_fix_hint()}") from exc
    for worker in found:
        if worker["import_error"]:
            raise ExecutorEnvironmentError(
                f"Spark's Python workers cannot import delayq: {worker['import_error']}. They "
                f"ran {worker['python']} (Python {worker['version']}); this driver runs "
                f"{sys.executable}. {_fix_hint()}")
    for worker in found:
        if worker["db_error"]:
            raise DatabaseUnavailable(
                f"Spark executors cannot reach the database {mask_password(database_url)}: "
                f"{worker['db_error']} (nothing was written; the driver could connect, so "
                "check the host name, network and credentials as seen from the executors)")


def _fix_hint() -> str:
    return (f"Install delayq[spark] into the workers' interpreter, or start Spark with one "
            f"that has it: PYSPARK_PYTHON={sys.executable} in the environment before the "
            f"session starts, or .config('spark.pyspark.python', '{sys.executable}') "
            "(local_session() does this for you).")


def _last_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln and ":" in ln]
    return (errors or lines or [type(exc).__name__])[-1].strip()


def local_session(
    app_name: str = "delayq", master: str = "local[2]", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A local-mode session with ``LOCAL_CONF``; executors run this interpreter.

    Parameters:
      app_name: the Spark application name.
      master: the Spark master.
      conf: Spark settings added to (or replacing) ``LOCAL_CONF``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for name, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(name, value)
    return builder.getOrCreate()
