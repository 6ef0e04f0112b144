"""Django's task framework on delayq (delayq_transport/django/tasks.py, worker.py), tested
against the suite's real Django project (tests/django_project: its settings' ``TASKS``, its
tasks in shop/djtasks.py) and a real PostgreSQL database.

Both frameworks delayq_transport/django/_framework.py picks from, and the tests import the
framework from there only: ``django.tasks`` of Django 6 (Python >= 3.12: scripts/test runs
this directory with the 3.12 environment, constraints/dev-py312.txt) and the django-tasks
backport on Django 5.2 (the suite's Python 3.11 environment runs it a second time). Under a
Django with neither it is not collected.

The project is set up in this process once, on a database of its own copied from the suite's
migrated template (Django's own tables migrated into it): in-process tests enqueue and read
results through ``django.tasks`` here, and worker processes (``manage.py delayq_worker``) run
on the same database. Every test starts from empty tables.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import django
import psycopg
import pytest

if TYPE_CHECKING:
    from delayq_transport.django._framework import TaskResult
    from delayq_transport.django.worker import Worker

PROJECT = Path(__file__).resolve().parents[1] / "django_project"
ROOT = PROJECT.parents[1]
#: The project's database in this process (created by ``dj_url``, from the suite's template).
DB_NAME = f"delayq_dj6_{os.getpid()}"

if django.VERSION < (6, 0) and find_spec("django_tasks") is None:  # neither framework
    collect_ignore_glob = ["test_*.py"]
else:
    # Set up before collection: test modules declare tasks
    # at import, which needs the settings; the database is only connected to by the tests.
    from conftest import url_for

    os.environ["DJANGO_DATABASE_URL"] = url_for(DB_NAME)
    os.environ["DJANGO_SETTINGS_MODULE"] = "djproject.settings"
    os.environ.pop("DJANGO_TASKS_OPTIONS", None)
    # django-celery-beat's tables, for periodic tasks edited in the admin (test_periodic_admin)
    os.environ["DJANGO_BEAT_APPS"] = "1"
    sys.path.insert(0, str(PROJECT))
    django.setup()
#: Tables every test starts without rows.
TABLES = ("delayed_queue", "delayq_task_results", "delayq_schedule_installed",
          "delayq_schedule_schedulers",
          "delayq_schedule_entries", "shop_taskrun", "shop_order", "delayed_queue__controls",
          "delayed_queue__control_slots", "delayed_queue__control_keys")
T = TypeVar("T")


def wait_until(predicate: Callable[[], T | None], message: str, timeout: float = 30.0,
               interval: float = 0.02) -> T:
    """Bounded wait for an observable state; the AssertionError names it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}")
        time.sleep(interval)


@pytest.fixture(scope="session", autouse=True)
def dj_url(template_db: str) -> Iterator[str]:
    """The project's database (Django's tables migrated into it); autouse: test
    classes need it before their class set-up runs."""
    from conftest import create_database, drop_database

    drop_database(DB_NAME)
    url = create_database(DB_NAME, template=template_db)
    assert url == os.environ["DJANGO_DATABASE_URL"]
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    yield url
    from django.db import connections

    from delayq_transport.django.backend import close_stores

    connections.close_all()
    close_stores()
    drop_database(DB_NAME)


@pytest.fixture(autouse=True)
def _fresh(request: pytest.FixtureRequest) -> Iterator[None]:
    """Empty tables before each test; the process' pools closed after it (the suite checks
    every test closes the Databases it made)."""
    url = request.getfixturevalue("dj_url")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE " + ", ".join(TABLES))
    yield
    from django.db import connections

    from delayq_transport.django.backend import close_stores
    from delayq_transport.django.target import close_queues

    close_stores()
    close_queues()
    connections.close_all()


def sql(url: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def runs(url: str, prefix: str = "") -> list[tuple[str, str, int, int]]:
    """(label, result id, attempt, pid) of every task run the project recorded, in order."""
    return [(str(a), str(b), int(c), int(d)) for a, b, c, d in sql(
        url, "SELECT label, result_id, attempt, pid FROM shop_taskrun WHERE label LIKE %s "
        "ORDER BY id", [prefix + "%"])]


def project_env(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DJANGO_DATABASE_URL=url, DJANGO_SETTINGS_MODULE="djproject.settings",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(PROJECT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


class WorkerProcess:
    """``manage.py delayq_worker`` in a process group of its own, its output in a log file."""

    def __init__(self, env: dict[str, str], log_path: Path, *args: str) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "delayq_worker", *args], cwd=PROJECT, env=env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, count: int = 1, timeout: float = 30.0) -> None:
        def seen() -> bool:
            if self.log().count(text) >= count:
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited {self.proc.returncode}:\n"
                                     f"{self.log()[-3000:]}")
            return False

        wait_until(seen, f"{text!r} x{count} in the worker's output", timeout)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        self._log.close()


@pytest.fixture
def start_worker(dj_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``manage.py delayq_worker`` with these arguments (and environment additions);
    returns once it is ready. Every worker started is stopped at the end of the test."""
    started: list[WorkerProcess] = []

    def start(*args: str, ready: int = 1, **extra: str) -> WorkerProcess:
        proc = WorkerProcess(project_env(dj_url, **extra),
                             tmp_path / f"worker-{len(started)}.log", *args)
        started.append(proc)
        proc.wait_for_log(" ready", count=ready, timeout=60)
        return proc

    yield start
    for proc in started:
        proc.stop()


@contextmanager
def gate_closed(url: str) -> Iterator[Callable[[], None]]:
    """shop.djtasks' ``gate`` task waits, once started, until the function this yields is
    called (an advisory lock this block holds; the block's end releases it too)."""
    from shop.djtasks import GATE_LOCK

    with psycopg.connect(url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [GATE_LOCK])
        yield lambda: holder.execute("SELECT pg_advisory_unlock(%s)", [GATE_LOCK]) and None


def start_gated(start: Callable[..., WorkerProcess], url: str, label: str, *args: str,
                **env: str) -> tuple[WorkerProcess, TaskResult]:
    """A worker (``start_worker`` with these arguments) that has started shop.djtasks' ``gate``
    task (run it inside :func:`gate_closed`), and the task's result."""
    from shop import djtasks

    worker = start(*args, **env)
    result = djtasks.gate.enqueue(label)
    wait_until(lambda: runs(url), "the task to start")
    return worker, result


def row_count(url: str) -> int:
    """Rows of the queue table (waiting, leased or not yet acked)."""
    return int(sql(url, "SELECT count(*) FROM delayed_queue")[0][0])



#: Statuses a result does not leave (TaskResultStatus values are these strings).
FINAL = ("SUCCESSFUL", "FAILED")


@contextmanager
def running(threads: int = 2, **options: Any) -> Iterator[Worker]:
    """A worker of the project's default backend (with these OPTIONS) on a thread of this
    process; stopped (and its shutdown checked) at the end of the block."""
    from django.test.utils import override_settings

    from delayq_transport.django._framework import task_backends
    from delayq_transport.django.tasks import DelayqBackend
    from delayq_transport.django.worker import Worker

    setting = {"default": {"BACKEND": "delayq_transport.django.tasks.DelayqBackend",
                           "QUEUES": ["default", "mail"], "OPTIONS": options}}
    with override_settings(TASKS=setting):
        backend = task_backends["default"]
        assert isinstance(backend, DelayqBackend)
        worker = Worker(backend, threads=threads, shutdown_timeout=10)
        thread = threading.Thread(target=worker.run, name="test-worker")
        thread.start()
        assert worker.ready.wait(30)
        try:
            yield worker
        finally:
            worker.stop()
            thread.join(60)
            assert not thread.is_alive()


def finished(result: TaskResult, timeout: float = 30) -> TaskResult:
    """The result once a worker finished the task (refreshed from the database)."""
    def done() -> bool:
        result.refresh()
        return result.status in FINAL

    wait_until(done, f"task {result.task.name} {result.id} to finish", timeout)
    return result
