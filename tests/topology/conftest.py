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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _celery_apps import close_connections

from . import clusters
from .services import RESULTS_DDL, Service, python_module

#: Every URL the tests give a process carries this password: it must never be printed.
SECRET = "s3cret-Pw"


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """``start_service(name, *args, env=...)`` runs ``python -m <args>``; all are stopped at
    teardown, together (each takes a while to come round to SIGTERM)."""
    started: list[Service] = []

    def start(name: str, *args: str, env: dict[str, str]) -> Service:
        service = Service(python_module(*args), env,
                          tmp_path / f"{name}-{len(started)}.log")
        started.append(service)
        return service

    yield start
    for service in started:
        if service.alive():
            os.killpg(service.proc.pid, signal.SIGTERM)
    for service in started:
        service.stop()


@pytest.fixture
def results_url(database_url: str) -> str:
    """This test's database on the shared server, with the ``executions`` table tasks write."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(RESULTS_DDL)
    return database_url


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
