"""Celery tasks published in the application's own transaction (issue 34), run by a real
``celery worker``: unchanged task code inside ``delayq_transport.transaction(conn)``.

* every publishing form (``delay``, ``apply_async`` with countdown/eta/expires/priority/queue,
  ``signature.apply_async``, ``chain()``, ``group()``) writes in the transaction: nothing is
  visible before the commit, delayq's pool is not asked for a connection, everything runs
  after the commit, nothing of a rolled-back transaction ever runs;
* a worker whose fallback poll is a minute away runs a committed task within seconds: the
  NOTIFY sent inside the transaction is delivered at its commit, and lowers the worker's low
  watermark below the row's (older) scheduledAt;
* several producer processes, each running transactions of which a seeded half roll back:
  exactly the committed orders get their receipt, once each, and every receipt finds its
  order;
* a producer killed with SIGKILL inside its transaction: nothing of it runs;
* a ``.delay()`` inside a transaction on another database than the broker's raises
  ``delayq_transport.TransactionRefused`` itself (not kombu's ``OperationalError`` around it),
  on the first try: the documented ``except`` catches it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kombu
import psycopg
import pytest
from celery import chain, group
from conftest import create_database, drop_database

from delayq_transport import TransactionRefused, transaction
from delayq_transport.transport.backend import Backend

from .conftest import CeleryProcess, executions, wait_until

HERE = Path(__file__).parent
#: The worker's fallback poll and watermark probe: far longer than any wait below, so only a
#: NOTIFY (or a due-time timer) can wake it in time.
SLOW = json.dumps({"acquire_timeout": 10, "polling_interval": 60, "full_rescan_interval": 60})
#: The table tx_tasks.receipt reads (as tx_tasks.ORDERS_DDL; that module is the worker's).
ORDERS_DDL = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)"


@pytest.fixture
def orders(celery_env: dict[str, str]) -> str:
    url = celery_env["DELAYQ_RESULTS_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(ORDERS_DDL)
    return url


def pool_requests() -> int:
    """Connections asked of every delayq pool of this process (the producer's transports)."""
    return sum(p.get_stats().get("requests_num", 0) for b in Backend._registry.values()
               for p in [b.db.pool] + ([b.db.relaxed_pool] if b.db.has_relaxed_pool else []))


def args_run(url: str, name: str = "mark") -> list[Any]:
    return [json.loads(e["arg"]) for e in executions(url, name)]


def rows_of(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM delayed_queue").fetchone()
    return int(row[0]) if row else 0


def publish_every_form(tag: str, mark: Any) -> None:
    """Each way Celery publishes at call time, labelled with ``tag``."""
    mark.delay(f"{tag}delay")
    mark.apply_async((f"{tag}countdown",), countdown=1)
    mark.apply_async((f"{tag}eta",), eta=datetime.now(UTC) + timedelta(seconds=1))
    mark.apply_async((f"{tag}expires",), expires=300)
    mark.apply_async((f"{tag}priority",), priority=9)
    mark.apply_async((f"{tag}queue",), queue="other")
    mark.s(f"{tag}signature").apply_async()
    chain(mark.s(f"{tag}chain1"), mark.si(f"{tag}chain2"))()
    group(mark.s(f"{tag}group1"), mark.s(f"{tag}group2"))()


FORMS = ["delay", "countdown", "eta", "expires", "priority", "queue", "signature", "chain1",
         "chain2", "group1", "group2"]


def test_every_publishing_form_joins_the_transaction(
        producer: Any, start_worker: Callable[..., CeleryProcess], database_url: str,
        celery_env: dict[str, str]) -> None:
    from .celery_app import mark

    results = celery_env["DELAYQ_RESULTS_URL"]
    start_worker("-Q", "celery,other")
    mark.delay("warm")  # the producer's transport connects (once per process, as ever)
    wait_until(lambda: args_run(results) == ["warm"])
    wait_until(lambda: rows_of(database_url) == 0)  # its ack is flushed in a batch, a bit later
    before = pool_requests()
    with psycopg.connect(database_url) as conn:
        with transaction(conn):
            publish_every_form("", mark)
        assert pool_requests() == before  # no connection of delayq's own
        assert rows_of(database_url) == 0  # nothing visible before the commit
        conn.commit()
        with transaction(conn):
            publish_every_form("rb-", mark)
        conn.rollback()
    mark.apply_async(("sentinel",), countdown=2)  # after everything above, committed
    wait_until(lambda: "sentinel" in args_run(results), timeout=60)
    ran = args_run(results)
    assert sorted(ran) == sorted(["warm", "sentinel", *FORMS]), ran
    assert not [a for a in ran if a.startswith("rb-")]


def test_a_worker_is_woken_at_the_commit(
        producer: Any, start_worker: Callable[..., CeleryProcess], database_url: str,
        celery_env: dict[str, str]) -> None:
    """The row's scheduledAt is its transaction's start; the worker polls past that time
    meanwhile (a sentinel runs), so only the NOTIFY delivered at the commit finds it before
    the fallback poll, a minute away."""
    from .celery_app import mark

    results = celery_env["DELAYQ_RESULTS_URL"]
    start_worker(env={"DELAYQ_TRANSPORT_OPTIONS": SLOW})
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")  # the transaction starts here: the row's scheduledAt
        with transaction(conn):
            mark.delay("in-tx")
        mark.delay("sentinel")  # outside: committed and run while the transaction is open
        wait_until(lambda: args_run(results) == ["sentinel"])
        # The sentinel's ack is flushed in a batch a moment after it ran; the row of the open
        # transaction stays invisible all along, so the count reaches 0 only if it is.
        wait_until(lambda: rows_of(database_url) == 0,
                   message="a row visible while its transaction is open")
        assert args_run(results) == ["sentinel"]
        conn.commit()
        wait_until(lambda: "in-tx" in args_run(results), timeout=15,
                   message="the task committed 15 s ago to run (fallback poll: 60 s)")


def test_concurrent_producers_run_exactly_their_committed_tasks_once(
        producer: Any, start_worker: Callable[..., CeleryProcess], database_url: str,
        celery_env: dict[str, str], orders: str) -> None:
    from .celery_app import mark

    start_worker("-I", "tx_tasks")
    env = dict(celery_env)
    procs = [subprocess.Popen(
        [sys.executable, str(HERE / "_tx_producer.py"), "run", database_url, f"p{i}", str(i),
         "40"], env=env, cwd=HERE, stdout=subprocess.PIPE, text=True) for i in range(4)]
    committed: list[str] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0
        committed += json.loads(out.strip().splitlines()[-1])
    assert 40 < len(committed) < 120  # the seeds roll back about half of 160
    mark.apply_async(("sentinel",), countdown=2)
    wait_until(lambda: len(executions(orders, "receipt")) >= len(committed)
               and args_run(orders) == ["sentinel"], timeout=120)
    receipts = [json.loads(e["arg"]) for e in executions(orders, "receipt")]
    assert sorted(r["order"] for r in receipts) == sorted(committed)  # each once, no other
    assert all(r["found"] for r in receipts)  # never ran before its order committed


def test_a_producer_killed_inside_its_transaction_publishes_nothing(
        producer: Any, start_worker: Callable[..., CeleryProcess], database_url: str,
        celery_env: dict[str, str], orders: str) -> None:
    from .celery_app import mark

    start_worker("-I", "tx_tasks")
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_tx_producer.py"), "hold", database_url, "held", "20"],
        env=dict(celery_env), cwd=HERE, stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    assert proc.stdout is not None
    ids = json.loads(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "HOLDING" and len(ids) == 20
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

    def backend_gone() -> bool:
        with psycopg.connect(database_url, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity "
                                "WHERE application_name = 'held'").fetchone() == (0,)

    wait_until(backend_gone, message="the killed producer's backend to end")
    with psycopg.connect(database_url, autocommit=True) as conn:
        left = conn.execute('SELECT count(*) FROM delayed_queue WHERE "pKey" = ANY(%s)',
                            (ids,)).fetchone()
    assert left == (0,)
    mark.delay("sentinel")
    wait_until(lambda: args_run(orders) == ["sentinel"])
    assert executions(orders, "receipt") == []


def test_a_refusal_reaches_the_view_as_transaction_refused_on_the_first_try(
        producer: Any, database_url: str) -> None:
    """What docs/how-to/transactions.md#errors promises a view: ``except TransactionRefused``
    around ``.delay()`` catches the wrong-database refusal. kombu wraps only the errors the
    transport declares recoverable, and retries only those: a refusal is neither, so it is
    raised as is, and kombu's ``ensure`` calls its errback (once per retry) never."""
    from .celery_app import mark

    mark.delay("warm")  # the producer's transport is connected before the refused publish
    other = f"delayq_other_{os.getpid()}"
    other_url = create_database(other)
    try:
        with psycopg.connect(other_url) as conn:
            conn.execute(ORDERS_DDL)
            with transaction(conn):
                conn.execute("INSERT INTO orders VALUES ('o1')")
                try:
                    mark.delay("refused")
                except TransactionRefused as refused:
                    caught: Exception | None = refused
                else:
                    caught = None
                assert caught is not None, "no TransactionRefused"
                assert not isinstance(caught, kombu.exceptions.OperationalError)
                assert other in str(caught) and "nothing was published" in str(caught)
                retries: list[BaseException] = []
                with producer.connection_for_write() as connection:
                    publish = connection.ensure(
                        connection, lambda: kombu.Producer(connection).publish(
                            "x", routing_key="celery"),
                        errback=lambda exc, interval: retries.append(exc), max_retries=3)
                    with pytest.raises(TransactionRefused):
                        publish()
                assert retries == []
            conn.commit()  # the caller's transaction is intact: its own row commits
            assert conn.execute("SELECT id FROM orders").fetchall() == [("o1",)]
    finally:
        drop_database(other)
    assert rows_of(database_url) == 1  # "warm" only (no worker runs here)
