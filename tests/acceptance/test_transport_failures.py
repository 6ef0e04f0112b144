"""Failures (issue 3, item 6): a PostgreSQL restart under load loses nothing; bad URLs, an
unreachable server, missing privileges and oversized messages fail with errors that say what is
wrong, and leave what is stored alone.

The restart happens on a private server (``_pg_private``), never on the shared one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import kombu
import kombu.exceptions
import psycopg
import pytest
from _pg_private import PrivateServer

from delayq_transport import DatabaseError, DelayedQueue, InvalidInput

from .conftest import CeleryProcess, executions, wait_until

HERE = Path(__file__).parent
OUTAGE_S = 3.0


# -- PostgreSQL restarted under load ------------------------------------------------------------


@pytest.fixture
def private_pg() -> Iterator[PrivateServer]:
    server = PrivateServer()
    yield server
    server.close()


def start_load(n: int, env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as sink:
        return subprocess.Popen([sys.executable, str(HERE / "_kombu_load.py"), str(n)],
                                cwd=HERE, env=env, stdout=sink, stderr=subprocess.STDOUT)


def producer_report(out: Path) -> tuple[dict[int, float], list[str]]:
    """({index the producer saw committed: seconds its publish took}, publishes it gave up on)."""
    acked, failed = {}, []
    for line in out.read_text().splitlines():
        if line.startswith("ok "):
            _, i, seconds = line.split()
            acked[int(i)] = float(seconds)
        elif line.startswith("fail "):
            failed.append(line)
    return acked, failed


def assert_duplicates_are_redeliveries(runs: list[dict[str, Any]]) -> int:
    """At-least-once: a task may run twice only if the later runs were flagged redelivered."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_task[run["task_id"]].append(run)
    duplicates = 0
    for task_id, same in by_task.items():
        if len(same) > 1:
            duplicates += len(same) - 1
            assert all(r["redelivered"] for r in same[1:]), (task_id, same)
    return duplicates


@pytest.mark.slow
def test_postgres_restart_under_load_loses_nothing(
    private_pg: PrivateServer, celery_env: dict[str, str], database_url: str,
    start_worker: Callable[..., CeleryProcess], tmp_path: Path,
):
    """Producer and worker both ride through a restart; executions are recorded on the shared
    server so the record itself survives the outage."""
    n = 200
    env = dict(celery_env,
               DELAYQ_BROKER_URL="delayq+postgresql://postgres@localhost/postgres",
               DELAYQ_TRANSPORT_OPTIONS=json.dumps({"database_url": private_pg.url(),
                                                    "acquire_timeout": 5,
                                                    "polling_interval": 1}),
               DELAYQ_ACKS_LATE="1")
    worker = start_worker(env=env)
    out = tmp_path / "producer.out"
    load = start_load(n, env, out)
    wait_until(lambda: len(producer_report(out)[0]) >= n // 3, timeout=60,
               message="a third of the load published")
    wait_until(lambda: executions(database_url), message="the worker consuming")
    private_pg.stop()
    time.sleep(OUTAGE_S)  # the outage itself: longer than the driver-level retries (~1.5 s)
    private_pg.start()
    restarted_at = datetime.now(UTC)
    assert load.wait(timeout=90) == 0, out.read_text()[-3000:]
    acked, failed = producer_report(out)
    assert not failed and set(acked) == set(range(n))
    assert max(acked.values()) >= OUTAGE_S / 2, "no publish overlapped the outage"

    def all_ran() -> bool:
        return {int(r["arg"]) for r in executions(database_url, "mark")} >= set(acked)

    wait_until(all_ran, timeout=60, interval=0.2, message="every acked task to run")
    with DelayedQueue(private_pg.url(), kind="celery", ensure_schema=False) as q:
        wait_until(lambda: not q.status(), timeout=30, message="every row acked")
    duplicates = assert_duplicates_are_redeliveries(executions(database_url, "mark"))
    print(f"restart under load: {len(acked)} published (longest publish "
          f"{max(acked.values()):.1f}s), {duplicates} redelivered duplicates")
    # Recovered, whichever layer reconnected (the transport's retries, or Celery's consumer
    # restart): the same worker is alive and ran tasks after the server came back.
    assert worker.proc.poll() is None, worker.log()[-3000:]
    assert any(r["ran_at"] > restarted_at for r in executions(database_url, "mark"))


# -- clear errors -------------------------------------------------------------------------------


def connect_error(url: str, **options: Any) -> BaseException:
    """What a Celery user sees when the broker connection is first needed."""
    with kombu.Connection(url, transport_options=options) as conn:
        with pytest.raises(Exception) as info:
            conn.ensure_connection(max_retries=0)
    return info.value


def test_unresolvable_host_names_the_host():
    error = connect_error("delayq+postgresql://nohost.invalid/db")
    assert isinstance(error, kombu.exceptions.OperationalError)
    assert "nohost.invalid" in str(error) and "unreachable" in str(error)


@pytest.mark.parametrize("url,options", [
    ("delayq+mysql://user@host/db", {}),
    ("delayq+postgresql://postgres@localhost/db", {"database_url": "redis://localhost:6379/0"}),
])
def test_wrong_scheme_is_invalid_input(url: str, options: dict[str, Any]):
    error = connect_error(url, **options)
    assert isinstance(error, InvalidInput)
    assert "invalid database URL" in str(error) and "expected postgresql://" in str(error)


def test_unreachable_server_is_a_connection_error():
    error = connect_error("delayq+postgresql://postgres@127.0.0.1:1/postgres")
    assert isinstance(error, kombu.exceptions.OperationalError)  # kombu retries these
    assert "port 1" in str(error) and "Connection refused" in str(error)


@pytest.fixture
def unprivileged_url(database_url: str) -> Iterator[str]:
    """A login role with no rights on the (already migrated) queue table."""
    role = f"dq_noperm_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(role)))
    parts = urlsplit(database_url)
    yield urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                     (role,))
        conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))


def test_missing_privileges_name_the_permission(database_url: str, unprivileged_url: str):
    with DelayedQueue(database_url, kind="kept", ensure_schema=False) as owner:
        owner.offer("k1", b"stored before")
    with kombu.Connection("delayq+" + unprivileged_url,
                          transport_options={"ensure_schema": False}) as conn:
        with pytest.raises(DatabaseError) as publish_error:  # INSERT
            kombu.Producer(conn.default_channel).publish("x", routing_key="q")
        with pytest.raises(DatabaseError) as consume_error:  # SELECT (queue size, polling)
            with closing(conn.SimpleQueue("q")) as q:
                q.get(timeout=1)
    for error in (publish_error.value, consume_error.value):
        assert "permission denied for table delayed_queue" in str(error), error
    with kombu.Connection("delayq+" + unprivileged_url) as conn:  # ensure_schema: the default
        with pytest.raises(Exception) as connect_err:
            conn.ensure_connection(max_retries=0)
    assert "permission denied" in str(connect_err.value), connect_err.value
    with DelayedQueue(database_url, kind="kept", ensure_schema=False) as owner:
        row = owner.get("k1")
        assert row is not None and row.payload == b"stored before"
        assert [s.kind for s in owner.status()] == ["kept"]


def test_oversized_message_is_refused_and_nothing_stored_is_lost(database_url: str):
    options = {"max_message_size": 2000}
    with kombu.Connection("delayq+" + database_url, transport_options=options) as conn, \
            closing(conn.SimpleQueue("big")) as q:
        q.put("small")
        with pytest.raises(InvalidInput) as info:
            q.put("x" * 5000)
        message = q.get(timeout=2)
        assert message.payload == "small"
        message.ack()
    text = str(info.value)
    assert "max_message_size (2000)" in text and "'big'" in text
    size = int(text.split(" is ")[1].split(" bytes")[0])
    assert size > 5000


def test_oversized_celery_task_fails_at_apply_async(database_url: str, producer: Any):
    from .celery_app import mark

    original = producer.conf.broker_transport_options
    producer.conf.broker_transport_options = {"max_message_size": 2000}
    try:
        small = mark.apply_async(("fits",))
        with pytest.raises(InvalidInput, match=r"over max_message_size \(2000\)"):
            mark.apply_async(("x" * 5000,))
    finally:
        producer.conf.broker_transport_options = original
    with DelayedQueue(database_url, kind="celery", ensure_schema=False) as q:
        assert q.contains(small.id)
        assert q.count_waiting() == 1
