"""A managed service's limits, set by the DBA on the role (issue 26, item 5).

The role here has ``statement_timeout = 50ms``, ``lock_timeout = 10ms`` and
``idle_in_transaction_session_timeout = 1s`` (``ALTER ROLE ... SET``) and owns an empty
database, as on RDS, Cloud SQL or Azure with a per-application role. Under them every
runtime operation works (publish, poll, ack, lease, release, status, the Spark path's bulk
merge, a real worker), migrations wait for each other however long it takes, and what does
exceed a limit fails with an error naming the setting, never "database unreachable".
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from delayq_transport import Database, DelayedQueue, migrate
from delayq_transport.core import ServerTimeout
from delayq_transport.core.integrations import BulkWriter, copy_record
from delayq_transport.core.schema.migrations import MIGRATIONS, MIGRATIONS_TABLE, _lock_key

from .clusters import wait_for
from .services import Service, executions, process_env, worker_args

#: One pytest-xdist process runs these one after another: a lock wait is counted over every
#: dq_limited_* session of the server (tests/conftest.py). alone: on 2 busy cores the runtime
#: operations overran the roles' timeouts.
pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("dq-limited-roles"),
              pytest.mark.alone]

LIMITS = {"statement_timeout": "50ms", "lock_timeout": "10ms",
          "idle_in_transaction_session_timeout": "1s"}
ALL_VERSIONS = sorted(m.version for m in MIGRATIONS)


def _as(url: str, role: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rsplit('@', 1)[-1]}"))


@pytest.fixture
def limited(results_url: str) -> Iterator[tuple[str, str]]:
    """(role URL, admin URL) of an empty database owned by a role with ``LIMITS``."""
    role, db = f"dq_limited_{uuid.uuid4().hex[:8]}", f"dq_limited_{uuid.uuid4().hex[:8]}"
    admin_url = urlunsplit(urlsplit(results_url)._replace(path=f"/{db}"))
    with psycopg.connect(results_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        for name, value in LIMITS.items():
            admin.execute(f"ALTER ROLE \"{role}\" SET {name} = '{value}'")
        admin.execute(f'CREATE DATABASE "{db}" OWNER "{role}"')
    try:
        yield _as(admin_url, role), admin_url
    finally:
        with psycopg.connect(results_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            admin.execute(f'DROP ROLE "{role}"')


def _role_settings(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in LIMITS}


def test_a_migration_waits_for_another_migrator_past_the_roles_limits(
        limited: tuple[str, str]) -> None:
    """Workers that start together migrate one after the other on an advisory lock. Under the
    role's limits the waiting one was cancelled after 50 ms: a worker failed to start while
    another migrated. Here the lock is held for longer than every limit and every retry."""
    role_url, admin_url = limited
    assert _role_settings(role_url) == {"statement_timeout": "50ms", "lock_timeout": "10ms",
                                        "idle_in_transaction_session_timeout": "1s"}
    outcome: list[Any] = []
    with psycopg.connect(admin_url) as holder:  # another migrator, mid-way
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(MIGRATIONS_TABLE),))

        def run() -> None:
            try:
                with Database(role_url) as db:
                    outcome.append(migrate(db, "delayed_queue"))
            except Exception as exc:  # reported by the assertion below
                outcome.append(exc)

        migrator = threading.Thread(target=run)
        migrator.start()
        wait_for(lambda: outcome or _waiting_on_lock_for(admin_url, 2.0),
                 "the migration to wait on the advisory lock for 2 s", timeout=30)
        assert not outcome, f"the waiting migration ended: {outcome}"
    migrator.join(timeout=30)
    assert outcome == [ALL_VERSIONS]


def _waiting_on_lock_for(admin_url: str, seconds: float) -> bool:
    """One statement of the limited role has waited on a lock for ``seconds`` (not cancelled
    and retried: a retry starts a new statement)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename LIKE 'dq_limited_%%'"
            " AND wait_event_type = 'Lock' AND now() - query_start > make_interval(secs => %s)",
            (seconds,)).fetchone()
    return bool(row and row[0])


def test_a_migration_blocked_past_lock_timeout_fails_naming_it(
        limited: tuple[str, str]) -> None:
    """The DDL keeps the role's lock_timeout (a waiting ALTER TABLE queues every statement
    behind it): blocked by another session's lock through every retry, the migration fails
    with an error that names lock_timeout, and passes once the lock is gone."""
    role_url, admin_url = limited
    with Database(role_url) as db:
        migrate(db, "delayed_queue")
        with psycopg.connect(admin_url) as holder:
            holder.execute(f"DELETE FROM {MIGRATIONS_TABLE} WHERE version = 4")  # autovacuum
            holder.commit()
            holder.execute("LOCK TABLE delayed_queue IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(ServerTimeout, match="lock_timeout") as info:
                migrate(db, "delayed_queue")
            assert info.value.setting == "lock_timeout"
        assert migrate(db, "delayed_queue") == [4]


def test_every_runtime_operation_works_under_the_limits(
        limited: tuple[str, str], results_url: str,
        start_service: Callable[..., Service], make_producer: Callable[..., Any]) -> None:
    role_url, _ = limited
    with DelayedQueue(role_url, kind="k", relaxed_consumer_commits=True) as queue:
        queue.offer("a", b"1")
        queue.offer("b", b"2", durable=False)
        queue.offer_batch([("c", b"3", None), ("d", b"4", None)])
        time.sleep(1.5)  # pooled sessions idle past idle_in_transaction_session_timeout
        got, _ = queue.poll(10)
        assert sorted(e.key for e in got) == ["a", "b", "c", "d"]
        assert queue.extend_lease([got[0].lock]) == 4  # one lock per poll
        assert queue.release(got[1:2]) == 1
        assert queue.ack_many(got[2:]) == 2
        assert sum(s.due + s.in_flight for s in queue.status()) == 2
        # The Spark path: binary COPY into a staging table, then one merge.
        with BulkWriter(queue.db) as writer:
            writer.write(b"".join(copy_record(f"s{i}", "k", b"x", 0) for i in range(1000)),
                         1000)
        assert writer.counts.created == 1000

    env = process_env(DELAYQ_BROKER_URL="delayq+" + role_url, DELAYQ_RESULTS_URL=results_url,
                      DELAYQ_TRANSPORT_OPTIONS=json.dumps({"polling_interval": 1}))
    worker = start_service("worker", *worker_args("limited"), env=env)
    worker.wait_for_log("ready.")
    producer = make_producer("delayq+" + role_url)
    for i in range(50):
        producer.send_task("topology.note", args=[f"n-{i}"], countdown=1 if i % 2 else None)
    wait_for(lambda: len(executions(results_url, "note")) >= 50, "50 tasks to run", timeout=60)
    assert "Traceback" not in worker.log(), worker.log()[-3000:]


def test_a_statement_over_statement_timeout_fails_naming_it(limited: tuple[str, str]) -> None:
    """A bulk merge bigger than 50 ms allows (the Spark path with 300,000 rows) is cancelled:
    the error names statement_timeout and what to do, not "database unreachable"."""
    role_url, _ = limited
    rows = b"".join(copy_record(f"big{i}", "k", b"x", 0) for i in range(300_000))
    with Database(role_url) as db:
        migrate(db, "delayed_queue")
        with BulkWriter(db, flush_rows=10**6) as writer:
            with pytest.raises(ServerTimeout, match="statement_timeout") as info:
                writer.write(rows, 300_000)
                writer.flush()
    assert info.value.setting == "statement_timeout"
    assert "PGOPTIONS" in str(info.value)  # and what to do about it
