"""The topology tier: delayq on the PostgreSQL production runs on, a primary with standbys,
a server with few connection slots, roles with a managed service's timeouts.

Tests here start real ``celery worker`` / ``celery beat`` / ``dramatiq`` / ``delayq``
processes (:class:`Service`) and, where they need to kill or reconfigure a server, throw-away
clusters (:mod:`.clusters`); the shared server on 127.0.0.1:5432 only ever gets databases and
roles of their own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _celery_apps import close_connections

from . import clusters

HERE = Path(__file__).parent
TESTS = HERE.parent
ROOT = TESTS.parent
#: Every URL the tests give a process carries this password: it must never be printed.
SECRET = "s3cret-Pw"
RESULTS_DDL = """CREATE TABLE IF NOT EXISTS executions (
    id BIGSERIAL PRIMARY KEY, task_id TEXT, name TEXT, arg TEXT, pid INT,
    redelivered BOOLEAN, eta TEXT, ran_at TIMESTAMPTZ DEFAULT clock_timestamp())"""


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a started process: this checkout first on the path (the package may
    be installed from another one), then the apps of this tier and of tests/acceptance."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(HERE), str(TESTS / "acceptance"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class Service:
    """A started process (its own session, so a stop reaches its children) whose output goes
    to a log file the test searches."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path,
                 cwd: Path = HERE) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        """Bounded wait until ``text`` is in the output; fails at once if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if not self.alive():
                raise AssertionError(f"{self.args[2:4]} exited {self.proc.returncode} before "
                                     f"{text!r}:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the output of {self.args[2:4]} after "
                             f"{timeout:.0f}s:\n{self.log()[-3000:]}")

    def stop(self, timeout: float = 20.0) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._log.close()


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """``start_service(name, *args, env=...)`` runs ``python -m <args>``; all are stopped at
    teardown, together (each takes a while to come round to SIGTERM)."""
    started: list[Service] = []

    def start(name: str, *args: str, env: dict[str, str]) -> Service:
        service = Service([sys.executable, "-m", *args], env,
                          tmp_path / f"{name}-{len(started)}.log")
        started.append(service)
        return service

    yield start
    for service in started:
        if service.alive():
            os.killpg(service.proc.pid, signal.SIGTERM)
    for service in started:
        service.stop()


def worker_args(name: str, *extra: str) -> list[str]:
    return ["celery", "-A", "topology_app", "worker", "--loglevel=INFO", "-P", "solo",
            "-n", f"{name}-{os.getpid()}@%h", *extra]


def beat_args() -> list[str]:
    return ["celery", "-A", "topology_app", "beat", "-S", "delayq_beat.Scheduler",
            "--loglevel=INFO"]


@pytest.fixture
def results_url(database_url: str) -> str:
    """This test's database on the shared server, with the ``executions`` table tasks write."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(RESULTS_DDL)
    return database_url


def executions(results_url: str, name: str | None = None) -> list[dict[str, Any]]:
    with psycopg.connect(results_url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        where = " WHERE name = %s" if name else ""
        return cur.execute(f"SELECT * FROM executions{where} ORDER BY id",
                           (name,) if name else ()).fetchall()


@pytest.fixture
def make_producer() -> Iterator[Callable[..., Any]]:
    """A Celery app in the test process that publishes to ``broker_url`` (closed after)."""
    from celery import Celery

    apps: list[Any] = []

    def make(broker_url: str | list[str], **options: Any) -> Any:
        app = Celery(f"topology-producer-{len(apps)}", set_as_current=False)
        app.conf.update(broker_url=broker_url, task_default_queue="celery",
                        broker_transport_options=options)
        apps.append(app)
        return app

    yield make
    for app in apps:
        close_connections(app)
        app.close()


@pytest.fixture(scope="session")
def cluster_tools() -> None:
    """Throw-away clusters need PostgreSQL's binaries and its account: without them this tier
    fails with the reason (a skipped failover test would read as a pass)."""
    reason = clusters.available()
    if reason:
        pytest.fail(f"cannot start throw-away PostgreSQL clusters: {reason}")


@pytest.fixture
def scratch(cluster_tools: None) -> Iterator[Path]:
    """A directory for this test's clusters, deleted after them."""
    root = clusters.scratch_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)
