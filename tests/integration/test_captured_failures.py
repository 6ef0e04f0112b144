"""The failures docs/troubleshooting.md shows, made to happen for real and captured.

Each test runs what a user runs (a ``delayq`` command in its own process, a Celery ``.delay()``,
Django's start) into a failure, asserts what matters about it, and hands what it saw to
tests/_captured.py: the committed capture (docs/_captured/NAME.json) must match, and the page
shows it (docs/_gen/captured.py). Failures of worker and beat processes are in
tests/acceptance/test_captured_workers.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _captured import capture, traceback_end
from _celery_apps import close_connections
from _pg_roles import bare_role as no_grants
from _pg_roles import role_url
from celery import Celery
from conftest import create_database, drop_database, url_for

import delayq_transport  # noqa: F401  (registers the delayq+ scheme)
from delayq_transport import InvalidInput, PermissionDenied, TransactionRefused
from delayq_transport.core.queue import set_implicit

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests/integration/test_captured_failures.py"
#: How a user's shell runs the command (the console script's own entry point).
DELAYQ = [sys.executable, "-c", "from delayq_transport.cli import main; main(prog_name='delayq')"]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    return {**base, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **extra}


def delayq(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``delayq ARGS`` in a process of its own: its exit status, stdout and stderr."""
    return subprocess.run([*DELAYQ, *args], env=env(**extra), capture_output=True, text=True,
                          timeout=120, check=False)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture
def bare_role(database_url: str) -> Iterator[str]:
    """A LOGIN role that was granted nothing."""
    with no_grants(database_url) as name:
        yield name


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database where ``delayq migrate`` never ran."""
    name = f"delayq_t_{uuid.uuid4().hex[:12]}"
    url = create_database(name)
    try:
        yield url
    finally:
        drop_database(name)


# -- kombu without the import ------------------------------------------------------------


def test_a_publish_without_import_delayq_transport() -> None:
    code = ("from celery import Celery\n"
            "app = Celery('proj', broker='delayq+postgresql://app@127.0.0.1:5432/app')\n"
            "@app.task\n"
            "def add(x, y):\n    return x + y\n"
            "add.delay(1, 2)\n")
    done = run_python(code)
    assert done.returncode == 1 and "delayq_transport" not in done.stderr
    name, message = traceback_end(done.stderr)
    assert name == "KeyError"
    capture("no-such-transport", f"{HERE}::test_a_publish_without_import_delayq_transport",
            raised=(name, message))


# -- Django ------------------------------------------------------------------------------


def test_a_delay_inside_atomic_on_another_database_is_refused(database_url: str) -> None:
    from _djbeat import django_database
    from django.db import transaction

    from delayq_transport.django.apps import atomic_transaction

    app = Celery("proj", broker="delayq+" + database_url, set_as_current=False)

    @app.task(name="shop.tasks.send_receipt")
    def send_receipt(order_id: int) -> None: ...

    other = f"delayq_django_{uuid.uuid4().hex[:8]}"
    try:
        with django_database(create_database(other)):
            set_implicit(atomic_transaction("default"))
            with transaction.atomic(), pytest.raises(TransactionRefused) as refused:
                send_receipt.delay(42)
    finally:
        set_implicit(None)
        close_connections(app)
        drop_database(other)
    queue_db = database_url.rsplit("/", 1)[-1]
    capture("refused-other-database",
            f"{HERE}::test_a_delay_inside_atomic_on_another_database_is_refused",
            exc=refused.value, replace={other: "shop", queue_db: "queue"})


def test_django_start_with_delayq_database_not_in_databases() -> None:
    code = ("import django\nfrom django.conf import settings\n"
            "settings.configure(INSTALLED_APPS=['delayq_transport.django'],\n"
            "    DATABASES={'default': {'ENGINE': 'django.db.backends.postgresql',\n"
            "                           'NAME': 'shop'}},\n"
            "    DELAYQ_JOIN_ATOMIC=True, DELAYQ_DATABASE='queue')\n"
            "django.setup()\n")
    done = run_python(code)
    assert done.returncode == 1
    name, message = traceback_end(done.stderr)
    assert name == "django.core.exceptions.ImproperlyConfigured"
    capture("django-database-not-in-databases",
            f"{HERE}::test_django_start_with_delayq_database_not_in_databases",
            raised=(name, message))


def test_broker_url_of_a_sqlite_entry() -> None:
    from delayq_transport.django import broker_url

    with pytest.raises(InvalidInput) as refused:
        broker_url({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"})
    capture("django-not-postgresql", f"{HERE}::test_broker_url_of_a_sqlite_entry",
            exc=refused.value)


# -- permissions -------------------------------------------------------------------------


def test_a_command_as_a_role_without_grants(database_url: str, bare_role: str) -> None:
    url = role_url(database_url, bare_role)
    done = delayq("-d", url, "status")
    assert done.returncode == 1 and done.stdout == ""
    db = database_url.rsplit("/", 1)[-1]
    capture("permission-denied-command",
            f"{HERE}::test_a_command_as_a_role_without_grants",
            replace={bare_role: "app_web", f"/{db}": "/app"},
            command=f"delayq -d {url} status", output=done.stderr, exit_status=done.returncode)


def test_a_delay_as_a_role_without_grants(database_url: str, bare_role: str) -> None:
    app = Celery("proj", broker="delayq+" + role_url(database_url, bare_role),
                 set_as_current=False)

    @app.task(name="shop.tasks.send_receipt")
    def send_receipt(order_id: int) -> None: ...

    try:
        with pytest.raises(PermissionDenied) as refused:
            send_receipt.delay(42)
    finally:
        close_connections(app)
    db = database_url.rsplit("/", 1)[-1]
    capture("permission-denied-publish", f"{HERE}::test_a_delay_as_a_role_without_grants",
            exc=refused.value, replace={bare_role: "app_web", f"/{db}": "/app"})


def test_migrate_as_a_role_that_may_not_create_tables(empty_database: str,
                                                      bare_role: str) -> None:
    url = role_url(empty_database, bare_role)
    done = delayq("-d", url, "migrate")
    assert done.returncode == 1 and "permission denied for schema public" in done.stderr
    db = empty_database.rsplit("/", 1)[-1]
    capture("permission-denied-migrate",
            f"{HERE}::test_migrate_as_a_role_that_may_not_create_tables",
            replace={bare_role: "app_admin", f"/{db}": "/app"},
            command=f"delayq -d {url} migrate", output=done.stderr, exit_status=done.returncode)


# -- which database ----------------------------------------------------------------------


def test_a_command_on_a_database_without_delayqs_tables(empty_database: str) -> None:
    done = delayq("-d", empty_database, "status")
    assert done.returncode == 3 and done.stdout == ""
    db = empty_database.rsplit("/", 1)[-1]
    capture("schema-missing-command",
            f"{HERE}::test_a_command_on_a_database_without_delayqs_tables",
            replace={db: "app"}, command=f"delayq -d {empty_database} status",
            output=done.stderr, exit_status=done.returncode)


def test_a_command_on_a_database_that_cannot_be_reached() -> None:
    url = url_for(f"nonexistent_{uuid.uuid4().hex[:8]}")
    done = delayq("-d", url, "status")
    assert done.returncode == 4 and done.stdout == ""
    db = url.rsplit("/", 1)[-1]
    capture("unreachable-command",
            f"{HERE}::test_a_command_on_a_database_that_cannot_be_reached",
            replace={db: "shop"}, command=f"delayq -d {url} status", output=done.stderr,
            exit_status=done.returncode)


def test_a_command_without_a_database() -> None:
    done = delayq("status")
    assert done.returncode == 2 and done.stdout == ""
    capture("no-database-command", f"{HERE}::test_a_command_without_a_database",
            command="delayq status", output=done.stderr, exit_status=done.returncode)


def test_a_command_given_a_redis_url() -> None:
    done = delayq("-d", "redis://127.0.0.1:6379/0", "status")
    assert done.returncode != 0 and done.stdout == ""
    capture("not-postgresql-command", f"{HERE}::test_a_command_given_a_redis_url",
            command="delayq -d redis://127.0.0.1:6379/0 status", output=done.stderr,
            exit_status=done.returncode)
