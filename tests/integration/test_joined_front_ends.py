"""The front ends publishing in the caller's transaction, in-process (issue 34): kombu's
producer with routing through a named exchange and queue declarations, Dramatiq's ``send`` and
``send_with_options(delay=...)`` with and without ``publish_linger``; and libpq keyword/value
connection strings at every entry point (issue 36). Real worker processes are in
tests/acceptance/test_transactions_celery.py and test_django.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import kombu
import psycopg
import pytest
from click.testing import CliRunner

import delayq_transport  # noqa: F401  (registers the delayq+ scheme)
from delayq_transport import Database, transaction
from delayq_transport.cli import main as cli
from delayq_transport.core.db import mask_password
from delayq_transport.dramatiq import DelayqBroker
from delayq_transport.transport.backend import Backend


def committed(url: str, table: str = "delayed_queue") -> dict[str, tuple[str, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {k: (kind, at) for k, kind, at in conn.execute(
            f'SELECT "pKey", "pKind", "scheduledAt" FROM "{table}"').fetchall()}


def pool_requests() -> int:
    """Connections asked of every kombu transport pool of this process."""
    dbs = [b.db for b in Backend._registry.values()]
    return sum(p.get_stats().get("requests_num", 0) for db in dbs
               for p in [db.pool] + ([db.relaxed_pool] if db.has_relaxed_pool else []))


def bindings(url: str) -> set[tuple[str, str, str]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return set(conn.execute('SELECT "exchange", "routingKey", "queue" '
                                "FROM delayed_queue__bindings").fetchall())


def test_kombu_routes_through_the_callers_connection_and_declares_after_it(
        database_url: str) -> None:
    """A topic exchange's routing table is read in the caller's transaction; the queue kombu
    declares on the first publish is written after it, by the next lookup outside one."""
    exchange = kombu.Exchange("orders", type="topic")
    queue = kombu.Queue("receipts", exchange, routing_key="order.*")
    with kombu.Connection("delayq+" + database_url,
                          transport_options={"polling_interval": 1}) as conn:
        producer = conn.Producer()
        producer.publish({"warm": 1}, routing_key="warm", declare=[])  # the transport is up
        before = pool_requests()
        with psycopg.connect(database_url) as app, transaction(app):
            producer.publish({"n": 1}, exchange=exchange, routing_key="order.created",
                             declare=[queue], headers={"task": "t", "id": "task-1"})
            producer.publish({"n": 2}, exchange=exchange, routing_key="order.paid",
                             headers={"task": "t", "id": "task-2"})
            assert pool_requests() == before
            assert "task-1" not in committed(database_url)
            assert bindings(database_url) == set()  # not written in the transaction
        assert {"task-1", "task-2"} <= set(committed(database_url))
        producer.publish({"n": 3}, exchange=exchange, routing_key="order.x",
                         headers={"task": "t", "id": "task-3"})  # outside: writes the binding
        assert ("orders", "order.*", "receipts") in bindings(database_url)
        assert committed(database_url)["task-3"][0] == "receipts"


@pytest.fixture(params=[0.0, 0.05], ids=["direct", "publish_linger"])
def broker(request: pytest.FixtureRequest, database_url: str) -> Iterator[DelayqBroker]:
    made = DelayqBroker(url=database_url, publish_linger=request.param)
    dramatiq.set_broker(made)
    yield made
    made.close()


def test_dramatiq_send_and_delayed_send_join_the_transaction(
        broker: DelayqBroker, database_url: str) -> None:
    @dramatiq.actor(queue_name="mail", broker=broker)
    def send_receipt(order: int) -> None:
        raise AssertionError("not run here")

    with psycopg.connect(database_url) as app:
        with transaction(app):
            send_receipt.send(1)
            later = send_receipt.send_with_options(args=(2,), delay=60_000)
        assert committed(database_url) == {}
        app.commit()
        with transaction(app):
            send_receipt.send(3)
        app.rollback()
    rows = committed(database_url)
    kinds = sorted(kind for kind, _ in rows.values())
    assert kinds == ["dramatiq:mail", "dramatiq:mail"]
    eta = later.options["eta"]
    assert sorted(at for _, at in rows.values())[-1] == eta
    assert eta - int(time.time() * 1000) > 50_000


def test_keyword_value_strings_work_wherever_a_url_does(database_url: str,
                                                        tmp_path: Any) -> None:
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    conninfo = " ".join(f"{k}={v}" for k, v in info.items()) + " password='p w'"
    assert "p w" not in mask_password(conninfo) and "password=***" in mask_password(conninfo)
    with Database(conninfo) as db:
        assert db.identity[0] == info["dbname"]
    broker = DelayqBroker(url=conninfo)
    broker.close()
    with kombu.Connection("delayq+postgresql://", transport_options={
            "database_url": conninfo, "polling_interval": 1}) as conn:
        conn.Producer().publish({"x": 1}, routing_key="kw", headers={"task": "t", "id": "kw"})
    assert committed(database_url)["kw"][0] == "kw"
    result = CliRunner().invoke(cli, ["-d", conninfo, "status"])
    assert result.exit_code == 0, result.output
    assert "p w" not in result.output
