"""conftest.py of Dramatiq's own tests run against the delayq broker (copied in as conftest.py).

Written from what the selected test files ask for: ``stub_broker`` is a ``DelayqBroker`` on
the database in ``DELAYQ_PEER_DATABASE_URL`` (StubBroker's ``join(fail_fast=...)`` semantics
on), ``stub_worker`` an in-process ``Worker``, result and rate-limiter backends on Redis (a
database of its own, ``DELAYQ_PEER_REDIS_DB``) and in memory.
"""

from __future__ import annotations

import os

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import TimeLimit, default_middleware
from dramatiq.rate_limits import backends as rl_backends
from dramatiq.results import backends as res_backends

from delayq_transport.core import Database, migrate
from delayq_transport.dramatiq import DelayqBroker

REDIS_URL = "redis://127.0.0.1:6379/" + os.environ.get("DELAYQ_PEER_REDIS_DB", "13")


@pytest.fixture(scope="session")
def peer_database():
    db = Database(os.environ["DELAYQ_PEER_DATABASE_URL"], max_size=16)
    migrate(db, "delayed_queue")
    yield db
    db.close()


@pytest.fixture()
def stub_broker(peer_database, request):
    middleware = None
    if "time_limit" in request.node.name:
        # The TimeLimit tests give a 1 s limit to a 2-3 s sleep. Dramatiq's default checks the
        # limits once a second, so the check may come anywhere in the second after the limit,
        # and a check delayed past the sleep's end by a loaded machine lets the actor finish.
        # Checked every 100 ms, the limit is enforced within 0.1 s of passing, as the tests
        # expect; the tests and what they assert are unchanged.
        middleware = [TimeLimit(interval=100) if m is TimeLimit else m()
                      for m in default_middleware]
    broker = DelayqBroker(database=peer_database, ensure_schema=False, fail_fast_default=True,
                          polling_interval=1.0, middleware=middleware)
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture()
def stub_worker(stub_broker):
    worker = Worker(stub_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


def _redis_client():
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()  # only our own database number, never the whole server
    return client


@pytest.fixture()
def redis_result_backend():
    backend = res_backends.RedisBackend(client=_redis_client())
    yield backend
    backend.client.flushdb()


@pytest.fixture()
def stub_result_backend():
    return res_backends.StubBackend()


@pytest.fixture(params=["redis", "stub"])
def result_backend(request):
    return request.getfixturevalue(f"{request.param}_result_backend")


@pytest.fixture()
def redis_rate_limiter_backend():
    backend = rl_backends.RedisBackend(client=_redis_client())
    yield backend
    backend.client.flushdb()


@pytest.fixture()
def stub_rate_limiter_backend():
    return rl_backends.StubBackend()


@pytest.fixture(params=["redis", "stub"])
def rate_limiter_backend(request):
    return request.getfixturevalue(f"{request.param}_rate_limiter_backend")
