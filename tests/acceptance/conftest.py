"""Fixtures that run real ``celery worker`` / ``celery beat`` subprocesses on the delayq broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .celery_app import RESULTS_DDL

HERE = Path(__file__).parent


def broker_url(database_url: str) -> str:
    return "delayq+" + database_url


class CeleryProcess:
    """A ``celery`` subprocess whose output goes to a log file we can search."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", *args], cwd=HERE, env=env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"celery exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in celery output after {timeout}s:\n{self.log()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


@pytest.fixture
def celery_env(database_url: str) -> dict[str, str]:
    """Environment for the acceptance app pointed at this test's database."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(RESULTS_DDL)
    env = dict(os.environ)
    env.update(
        DELAYQ_BROKER_URL=broker_url(database_url),
        DELAYQ_RESULTS_URL=database_url,
        DELAYQ_TRANSPORT_OPTIONS=json.dumps({"acquire_timeout": 10, "polling_interval": 2}),
        PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent.parent),
                                    env.get("PYTHONPATH", "")]),
    )
    return env


@pytest.fixture
def start_celery(tmp_path: Path, celery_env: dict[str, str]) -> Iterator[Callable[..., CeleryProcess]]:
    """Start ``celery -A celery_app <args>``; every process is stopped at teardown."""
    procs: list[CeleryProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: str | None = None,
              name: str = "celery") -> CeleryProcess:
        full_env = dict(celery_env, **(env or {}))
        proc = CeleryProcess(["-A", "celery_app", *args], full_env,
                             tmp_path / f"{name}-{len(procs)}.log")
        procs.append(proc)
        if ready:
            proc.wait_for_log(ready)
        return proc

    yield start
    for proc in procs:
        proc.stop()


@pytest.fixture
def start_worker(start_celery: Callable[..., CeleryProcess]) -> Callable[..., CeleryProcess]:
    """A real ``celery worker`` (solo pool unless told otherwise), waited on until ready."""

    def start(*extra: str, env: dict[str, str] | None = None, name: str = "worker") -> CeleryProcess:
        args = ["worker", "--loglevel=INFO", "-n", f"{name}-{os.getpid()}-%h", *extra]
        if not any(a.startswith("-P") or a.startswith("--pool") for a in extra):
            args += ["-P", "solo"]
        return start_celery(*args, env=env, ready="ready.", name=name)

    return start


@pytest.fixture
def producer(database_url: str) -> Iterator[Any]:
    """The acceptance app, publishing to this test's database from the test process."""
    from .celery_app import app

    def reset() -> None:
        if app._pool is not None:
            app._pool.force_close_all()
            app._pool = None
        app.amqp._producer_pool = None

    reset()
    app.conf.broker_url = broker_url(database_url)
    yield app
    reset()


def executions(database_url: str, name: str | None = None) -> list[dict[str, Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        where = " WHERE name = %s" if name else ""
        return cur.execute(f"SELECT * FROM executions{where} ORDER BY id",
                           (name,) if name else ()).fetchall()


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05,
               message: str = "condition") -> Any:
    """Bounded wait for an observable event (no bare sleeps in tests)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")
