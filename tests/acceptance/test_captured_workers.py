"""The failures of real ``celery worker`` and ``celery beat`` processes that
docs/troubleshooting.md shows, made to happen and captured (tests/_captured.py): the log line
each prints and, for one that stops, its exit status. Commands and publishes:
tests/integration/test_captured_failures.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from _captured import capture, last_line_with
from _pg_roles import bare_role as no_grants
from _pg_roles import role_url
from conftest import create_database, drop_database

from .conftest import CeleryProcess, broker_url

HERE = "tests/acceptance/test_captured_workers.py"


def db_name(url: str) -> str:
    return url.rsplit("/", 1)[-1].split("?")[0]


def exited(proc: CeleryProcess, timeout: float = 60.0) -> int:
    """The worker's exit status, once it stopped by itself."""
    return proc.proc.wait(timeout=timeout)


@pytest.fixture
def bare_role(database_url: str) -> Iterator[str]:
    """A LOGIN role that was granted nothing."""
    with no_grants(database_url) as name:
        yield name


def worker(start_celery: Callable[..., CeleryProcess], **env: str) -> CeleryProcess:
    return start_celery("worker", "--loglevel=INFO", "-P", "solo", "-n", "w@%h", env=env,
                        name="worker")


def test_a_worker_of_a_role_without_grants(start_celery: Callable[..., CeleryProcess],
                                          database_url: str, bare_role: str) -> None:
    proc = worker(start_celery, DELAYQ_BROKER_URL=broker_url(role_url(database_url, bare_role)))
    status = exited(proc)
    line = last_line_with(proc.log(), "CRITICAL")
    assert status == 1 and "PermissionDenied" in line
    capture("permission-denied-worker", f"{HERE}::test_a_worker_of_a_role_without_grants",
            replace={bare_role: "app_worker", db_name(database_url): "app"},
            log=line, process="celery worker", exit_status=status)


def test_a_worker_of_a_dml_role_gives_up_waiting_for_delayq_migrate(
        start_celery: Callable[..., CeleryProcess], database_url: str) -> None:
    """A worker role on a database where ``delayq migrate`` never ran: it waits, saying so, and
    gives up after ``schema_wait`` (3 s here, 600 s by default)."""
    empty = f"delayq_t_{uuid.uuid4().hex[:12]}"
    url = create_database(empty)
    role = f"dq51_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        proc = worker(start_celery, DELAYQ_BROKER_URL=broker_url(role_url(url, role)),
                      DELAYQ_TRANSPORT_OPTIONS=json.dumps({"schema_wait": 3}))
        status = exited(proc)
        lines = [last_line_with(proc.log(), "waiting for its tables"),
                 last_line_with(proc.log(), "CRITICAL")]
        first = next(x for x in proc.log().splitlines() if "waiting for its tables" in x)
        proc.stop()
    finally:
        drop_database(empty)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP ROLE "{role}"')
    assert status == 1 and "SchemaMissing" in lines[1] and "after waiting 3 s" in lines[1]
    assert "giving up in 3 s" in first
    capture("schema-missing-worker",
            f"{HERE}::test_a_worker_of_a_dml_role_gives_up_waiting_for_delayq_migrate",
            replace={role: "app_worker", empty: "app"}, log="\n".join([first, lines[1]]),
            process="celery worker", exit_status=status)


def test_a_worker_whose_database_cannot_be_reached(
        start_celery: Callable[..., CeleryProcess]) -> None:
    proc = worker(start_celery, DELAYQ_BROKER_URL="delayq+postgresql://app@127.0.0.1:1/app")
    proc.wait_for_log("Trying again in", timeout=60)
    line = last_line_with(proc.log(), "Cannot connect")
    assert proc.proc.poll() is None  # it retries, as for any broker
    capture("unreachable-worker", f"{HERE}::test_a_worker_whose_database_cannot_be_reached",
            log=line)


def test_a_worker_told_it_is_behind_a_transaction_pooler(
        start_celery: Callable[..., CeleryProcess]) -> None:
    proc = worker(start_celery,
                  DELAYQ_TRANSPORT_OPTIONS=json.dumps({"pooling": "transaction"}))
    proc.wait_for_log("ready.")
    line = last_line_with(proc.log(), "LISTEN")
    capture("listen-transaction-pooler",
            f"{HERE}::test_a_worker_told_it_is_behind_a_transaction_pooler", log=line)


def test_a_worker_whose_listen_url_reaches_another_database(
        start_celery: Callable[..., CeleryProcess], database_url: str) -> None:
    other = f"delayq_t_{uuid.uuid4().hex[:12]}"
    other_url = create_database(other)
    try:
        proc = worker(start_celery,
                      DELAYQ_TRANSPORT_OPTIONS=json.dumps({"listen_url": other_url}))
        proc.wait_for_log("did not deliver a notification", timeout=60)
        line = last_line_with(proc.log(), "did not deliver")
        proc.stop()
    finally:
        drop_database(other)
    capture("listen-undelivered",
            f"{HERE}::test_a_worker_whose_listen_url_reaches_another_database",
            replace={other: "other", db_name(database_url): "app"}, log=line)


def test_beat_whose_broker_is_still_redis(start_celery: Callable[..., CeleryProcess]) -> None:
    proc = start_celery("beat", "-S", "delayq_beat.Scheduler", "--loglevel=INFO",
                        env={"DELAYQ_BROKER_URL": "redis://127.0.0.1:6379/0"}, name="beat")
    status = exited(proc)
    line = last_line_with(proc.log(), "CRITICAL")
    assert status == 1 and "invalid database URL" in line
    capture("not-postgresql-beat", f"{HERE}::test_beat_whose_broker_is_still_redis", log=line,
            process="celery beat", exit_status=status)
