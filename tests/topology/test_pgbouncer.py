"""delayq behind PgBouncer (Debian's 1.18): transaction pooling, where no named prepared
statement, session setting or LISTEN survives a transaction, and session pooling told to drop
the ``options`` startup parameter.

The specific guarantees are tested here; ``test_the_suite_through_pgbouncer`` runs a slice of
the integration and acceptance tiers (real Celery workers, beat, Dramatiq, the CLI, Spark,
least-privilege roles) with every test's database URL pointing at PgBouncer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import BASE_URL, template_copy

from delayq_transport import Database, DelayedQueue
from delayq_transport.core import ListenUndeliverable
from delayq_transport.core.db.database import cursor_of
from delayq_transport.core.db.queries import Queries, notify_channel
from delayq_transport.core.queue import Listener

from .pgbouncer import PgBouncer

ROOT = Path(__file__).resolve().parents[2]
TABLE = "delayed_queue"


@pytest.fixture(scope="module")
def transaction_bouncer() -> Iterator[PgBouncer]:
    """Transaction pooling with PgBouncer's defaults: ``options`` is refused."""
    bouncer = PgBouncer(BASE_URL, mode="transaction", pool_size=4).start()
    yield bouncer
    bouncer.stop()


@pytest.fixture(scope="module")
def session_bouncer() -> Iterator[PgBouncer]:
    """Session pooling that ignores ``options``: the settings are dropped without a word."""
    bouncer = PgBouncer(BASE_URL, mode="session", ignore_options=True).start()
    yield bouncer
    bouncer.stop()


def _settings(db: Database, relaxed: bool) -> tuple[str, ...]:
    row = db.fetchall("SELECT current_setting('jit'), current_setting('enable_seqscan'), "
                      "current_setting('synchronous_commit')", relaxed=relaxed)[0]
    return tuple(row)


def test_a_direct_server_is_a_session(database_url: str) -> None:
    with Database(database_url, max_size=1) as db:
        assert not db.transaction_pooling
        assert _settings(db, relaxed=True) == ("off", "off", "off")


@pytest.mark.parametrize("which", ["transaction_bouncer", "session_bouncer"])
def test_a_pooler_is_detected_and_the_settings_hold_per_transaction(
        request: pytest.FixtureRequest, database_url: str, which: str) -> None:
    """Refused (transaction) or dropped (session + ignore_startup_parameters) options: either
    way delayq sees it and applies its settings with SET LOCAL in every transaction."""
    bouncer: PgBouncer = request.getfixturevalue(which)
    with Database(bouncer.url(database_url), max_size=2) as db:
        assert db.transaction_pooling
        assert _settings(db, relaxed=True) == ("off", "off", "off")
        assert _settings(db, relaxed=False) == ("off", "on", "on")  # the durable pool's own


def test_explicit_session_mode_sets_the_settings_once_per_connection(
        session_bouncer: PgBouncer, database_url: str) -> None:
    with Database(session_bouncer.url(database_url), max_size=1, pooling="session") as db:
        assert not db.transaction_pooling
        assert _settings(db, relaxed=True) == ("off", "off", "off")


def test_many_threads_publish_poll_and_ack_through_transaction_pooling(
        transaction_bouncer: PgBouncer, database_url: str) -> None:
    """The failure this guards against: named statements (delayq's own and psycopg's
    automatic ``_pg3_N``) prepared on one server session and run, or prepared again, on
    another. 4 publishing threads, then 4 consuming ones, share 4 server connections; every
    message is delivered once."""
    url = transaction_bouncer.url(database_url)
    sent, got, errors = 400, [], []
    with DelayedQueue(url, kind="t", pool_max_size=8) as queue:
        def publish(start: int) -> None:
            try:
                for i in range(start, sent, 4):
                    queue.offer(f"k{i}", b"x")
                    queue.offer(f"k{i}", b"y", durable=False)  # a replace: the CAS path
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

        def consume() -> None:
            deadline = time.monotonic() + 60
            try:
                while len(got) < sent and time.monotonic() < deadline:
                    batch = queue.try_poll_many(7)
                    got.extend(e.key for e in batch)
                    queue.ack_many(batch)
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        for phase in ([threading.Thread(target=publish, args=(i,)) for i in range(4)],
                      [threading.Thread(target=consume) for _ in range(4)]):
            for t in phase:
                t.start()
            for t in phase:
                t.join(90)
        assert not errors, errors[:3]
        assert sorted(got) == sorted(f"k{i}" for i in range(sent))
        assert queue.count_waiting() == 0
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


@pytest.fixture(scope="module")
def million_rows(template_db: str) -> Iterator[str]:
    """1M waiting rows (200k due), analyzed, in a database that JIT-compiles every plan
    unless the session turns JIT off: the guard must be able to fail."""
    with template_copy(template_db, prefix="delayq_bouncer_plans") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{conn.info.dbname}" SET jit_above_cost = 0')
            conn.execute(f"""
                INSERT INTO {TABLE} ("pKey", "pKind", payload, "scheduledAt",
                                     "scheduledAtInitially", "createdAt")
                SELECT 'k' || i, 'test', '\\x00', t, t, 0
                FROM generate_series(1, 1000000) AS i,
                     LATERAL (SELECT CASE WHEN i % 5 = 0 THEN i ELSE 9e15::bigint + i END) AS s(t)
            """)
            conn.execute(f"ANALYZE {TABLE}")
        yield url


def _explain_poll(db: Database) -> dict[str, Any]:
    query = Queries(TABLE)["try_poll_many"]
    params = {"kinds": ["test"], "lows": [None], "want_next": True, "limit": 100,
              "lock": "L", "lease_ms": 60_000, "now": None}

    def work(conn: psycopg.Connection[Any]) -> Any:
        cur = cursor_of(conn)
        row = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()
        conn.rollback()  # the poll took rows: give them back
        return row[0][0]

    return db.run(work, relaxed=True)  # type: ignore[no-any-return]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_the_poll_stays_on_its_index_behind_transaction_pooling(
        transaction_bouncer: PgBouncer, million_rows: str) -> None:
    with Database(transaction_bouncer.url(million_rows), max_size=1) as db:
        assert db.transaction_pooling
        plan = _explain_poll(db)
    nodes = list(_nodes(plan["Plan"]))
    assert "JIT" not in plan, json.dumps(plan, indent=1)
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), json.dumps(plan, indent=1)
    assert any(n.get("Index Name") == f"{TABLE}__KindPlusScheduledAtIndex" for n in nodes)


def test_the_jit_guard_can_fail_behind_the_pooler(transaction_bouncer: PgBouncer,
                                                   million_rows: str) -> None:
    """Control: the same poll through the same pooler, without delayq's per-transaction
    settings (a plain connection), JIT-compiles."""
    query = Queries(TABLE)["try_poll_many"]
    with psycopg.connect(transaction_bouncer.url(million_rows), prepare_threshold=None) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query,
                           {"kinds": ["test"], "lows": [None], "want_next": True, "limit": 100,
                            "lock": "L", "lease_ms": 60_000, "now": None}).fetchone()
        conn.rollback()
    assert row is not None and "JIT" in row[0][0]


def test_listen_is_not_tried_through_transaction_pooling(transaction_bouncer: PgBouncer,
                                                         database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as direct, \
            DelayedQueue(transaction_bouncer.url(database_url), kind="t") as queue:
        direct.execute(f'LISTEN "{notify_channel(queue.table)}"')
        with pytest.raises(ListenUndeliverable, match="listen_url"):
            Listener(queue.db, queue.queries)
        # Known up front: no LISTEN, no probe sent (a probe goes out before its wait, and a
        # NOTIFY passes the pooler, so it would be here).
        assert list(direct.notifies(timeout=0.5)) == []


def test_a_listen_that_cannot_deliver_is_found_by_its_probe(transaction_bouncer: PgBouncer,
                                                            database_url: str) -> None:
    """Told (wrongly) that the pooler keeps sessions, delayq LISTENs through transaction
    pooling: LISTEN succeeds, its notifications never arrive, and the probe says so."""
    url = transaction_bouncer.url(database_url)
    with DelayedQueue(Database(url, max_size=2, pooling="session"), kind="t") as queue:
        try:
            with pytest.raises(ListenUndeliverable, match="did not deliver"):
                Listener(queue.db, queue.queries, probe_timeout_s=1.0)
        finally:
            queue.db.close()


def test_a_direct_listen_url_brings_push_wakeups_back(transaction_bouncer: PgBouncer,
                                                      database_url: str) -> None:
    with Database(transaction_bouncer.url(database_url), max_size=2,
                  listen_url=database_url) as db, DelayedQueue(db, kind="t") as queue:
        listener = Listener(db, queue.queries)
        try:
            queue.offer("woken", b"x")
            deadline, notes = time.monotonic() + 10, []
            while not notes and time.monotonic() < deadline:
                listener.wait(deadline - time.monotonic())
                notes = listener.drain()
            assert [kind for kind, _ in notes] == ["t"]
        finally:
            listener.close()


#: The slice of the suite run through PgBouncer in transaction pooling, one test or file per
#: path that talks to the database differently (the whole tiers through it would double the
#: suite's time): the queue API with its replace, bulk and count paths; the Celery transport end
#: to end (publish, countdowns, poll, ack, leases, kill -9); two beats installing the same
#: ticks; Dramatiq's broker and many producers and consumers counted; the bulk (Spark) path.
THROUGH_POOLER = [
    "tests/integration/test_queue.py",
    "tests/integration/test_dramatiq_broker.py",
    "tests/integration/test_bulk.py",
    "tests/acceptance/test_transport_basic.py",
    "tests/acceptance/test_transport_countdowns.py::test_eta_and_countdown_run_on_time_never_early",
    "tests/acceptance/test_transport_delivery.py::test_sigkill_redelivers_within_one_lease",
    "tests/acceptance/test_beat_processes.py::test_two_beats_every_tick_runs_exactly_once",
    "tests/acceptance/test_dramatiq_worker.py::"
    "test_many_producers_and_consumers_lose_and_duplicate_nothing[unbuffered]",
]


@pytest.mark.slow
def test_the_suite_through_pgbouncer() -> None:
    env = dict(os.environ, DELAYQ_TEST_POOLER="transaction")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *THROUGH_POOLER],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
