"""Fixtures that run real ``celery worker`` / ``celery beat`` subprocesses on the delayq broker."""

from __future__ import annotations

import json
import os
import re
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
from topology.clusters import wait_for
from topology.services import executions  # noqa: F401 - the tier's tests import it from here

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
        raise AssertionError(
            f"{text!r} not in celery output after {timeout}s:\n{self.log()[-3000:]}")

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
def start_celery(
    tmp_path: Path, celery_env: dict[str, str]
) -> Iterator[Callable[..., CeleryProcess]]:
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

    def start(
        *extra: str, env: dict[str, str] | None = None, name: str = "worker"
    ) -> CeleryProcess:
        args = ["worker", "--loglevel=INFO", "-n", f"{name}-{os.getpid()}-%h", *extra]
        if not any(a.startswith("-P") or a.startswith("--pool") for a in extra):
            args += ["-P", "solo"]
        return start_celery(*args, env=env, ready="ready.", name=name)

    return start


@pytest.fixture
def producer(database_url: str) -> Iterator[Any]:
    """The acceptance app, publishing to this test's database from the test process."""
    from .celery_app import app

    close_connections(app)
    app.conf.broker_url = broker_url(database_url)
    yield app
    close_connections(app)


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05,
               message: str = "condition") -> Any:
    """Bounded wait for an observable event (no bare sleeps in tests)."""
    return wait_for(predicate, message, timeout, interval)


# -- Added for test_transport_{cli,countdowns,delivery,routing}.py -----------------------------

NODE_READY = re.compile(r"(\S+@\S+) ready\.")


def worker_args(name: str, extra: tuple[str, ...]) -> list[str]:
    """``celery worker`` arguments as ``start_worker`` builds them (solo pool by default)."""
    args = ["worker", "--loglevel=INFO", "-n", f"{name}-{os.getpid()}-%h", *extra]
    if not any(a.startswith("-P") or a.startswith("--pool") for a in extra):
        args += ["-P", "solo"]
    return args


@pytest.fixture
def start_workers(start_celery: Callable[..., CeleryProcess]) -> Callable[..., list[CeleryProcess]]:
    """Several workers whose start-ups overlap (each takes seconds of imports), all ready."""

    def start(*extras: tuple[str, ...], env: dict[str, str] | None = None,
              name: str = "worker") -> list[CeleryProcess]:
        """One worker per tuple of extra ``celery worker`` arguments."""
        procs = [start_celery(*worker_args(f"{name}{i}", extra), env=env, name=f"{name}{i}")
                 for i, extra in enumerate(extras)]
        for proc in procs:
            proc.wait_for_log("ready.")
        return procs

    return start


def nodename(proc: CeleryProcess) -> str:
    """The worker's node name (``celery@...``), as remote control addresses it."""
    found = NODE_READY.search(proc.log())
    assert found, f"worker not ready:\n{proc.log()[-2000:]}"
    return found.group(1)


def stop_together(*procs: CeleryProcess) -> None:
    """Warm-shut several workers at once: each takes seconds to come round to the signal."""
    for proc in procs:
        if proc.proc.poll() is None:
            os.killpg(proc.proc.pid, signal.SIGTERM)
    for proc in procs:
        proc.stop()


@pytest.fixture
def celery_cli(celery_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m celery -A celery_app <args>`` to completion with the test's environment."""

    def run(*args: str, env: dict[str, str] | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "celery_app", *args], cwd=HERE,
            env=dict(celery_env, **(env or {})), capture_output=True, text=True, timeout=timeout,
        )

    return run


@pytest.fixture
def make_app(database_url: str, celery_env: dict[str, str]) -> Iterator[Callable[..., Any]]:
    """A fresh Celery app on this test's broker, for producer-side settings (routes, queues,
    transport options) that must not leak into the shared ``producer`` app."""
    from celery import Celery

    apps: list[Any] = []

    def make(**conf: Any) -> Any:
        app = Celery(f"acceptance-producer-{len(apps)}", set_as_current=False)
        defaults = {"broker_url": broker_url(database_url), "task_default_queue": "celery",
                    "broker_transport_options": json.loads(celery_env["DELAYQ_TRANSPORT_OPTIONS"])}
        app.conf.update({**defaults, **conf})
        apps.append(app)
        return app

    yield make
    for app in apps:
        close_connections(app)
        app.close()


@pytest.fixture
def dq(database_url: str) -> Iterator[Any]:
    """The default queue's table, to look at rows the way the transport stores them."""
    from delayq_transport import DelayedQueue

    with DelayedQueue(database_url, kind="celery") as queue:
        yield queue


def in_flight(queue: Any) -> int:
    """Rows currently leased to some consumer, over every kind of the table."""
    return sum(s.in_flight for s in queue.status())


def row_count(queue: Any) -> int:
    """Every row of the table, whatever its kind or state."""
    return sum(s.due + s.scheduled + s.in_flight for s in queue.status())


def received(proc: CeleryProcess, task_id: str) -> bool:
    """The worker logged the task as received (on the solo pool: it is about to run)."""
    return f"[{task_id}] received" in proc.log()
