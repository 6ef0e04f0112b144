"""The Dramatiq app of the acceptance tests: ``dramatiq dramatiq_app`` workers run it.

Every execution is recorded in the ``dramatiq_runs`` table of the test database, so the tests
count runs across worker processes (none lost, none twice). Results go to Redis
(``DELAYQ_REDIS_RESULTS``, a database number of its own).
"""

from __future__ import annotations

import os
import threading
import time

import dramatiq
import psycopg
from dramatiq.middleware import CurrentMessage
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from delayq_transport.dramatiq import DelayqBroker
from delayq_transport.dramatiq.periodic import PeriodicMiddleware, periodic

URL = os.environ["DELAYQ_DATABASE_URL"]
broker = DelayqBroker(url=URL, acquire_timeout=float(os.environ.get("DELAYQ_LEASE", "60")),
                      max_priority=3, polling_interval=2.0,
                      dead_message_ttl=int(os.environ.get("DELAYQ_DEAD_TTL_MS", 7 * 86400_000)),
                      publish_linger=float(os.environ.get("DELAYQ_PUBLISH_LINGER", "0")))
broker.add_middleware(CurrentMessage())
broker.add_middleware(Results(backend=RedisBackend(
    url=os.environ.get("DELAYQ_REDIS_RESULTS", "redis://127.0.0.1:6379/12"))))
if os.environ.get("DELAYQ_PERIODIC"):
    broker.add_middleware(PeriodicMiddleware(refresh_interval=1.0, horizon=30))
dramatiq.set_broker(broker)


_local = threading.local()


def _conn() -> psycopg.Connection:
    """One connection per worker thread: connecting per run would dominate the runtime."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        # No prepared statements: the test database may sit behind PgBouncer's transaction
        # pooling (tests/topology), where a statement prepared on one server session is gone.
        conn = _local.conn = psycopg.connect(URL, autocommit=True, prepare_threshold=None)
    return conn


def record(actor: str, tag: str, phase: str = "done") -> None:
    msg = CurrentMessage.get_current_message()
    _conn().execute(
        "INSERT INTO dramatiq_runs (actor, tag, pid, message_id, retries, phase) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (actor, tag, os.getpid(), msg.message_id if msg else None,
         (msg.options.get("retries", 0) if msg else 0), phase))


@dramatiq.actor(queue_name="alpha")
def note(tag: str) -> None:
    record("note", tag)


@dramatiq.actor(queue_name="beta")
def note_beta(tag: str) -> None:
    record("note_beta", tag)


@dramatiq.actor(store_results=True, max_retries=0)
def add(x: int, y: int = 0) -> int:
    record("add", f"{x}+{y}")
    return x + y


@dramatiq.actor(max_retries=3, min_backoff=200, max_backoff=400)
def flaky(tag: str, failures: int) -> None:
    msg = CurrentMessage.get_current_message()
    record("flaky", tag)
    if msg is not None and msg.options.get("retries", 0) < failures:
        raise RuntimeError(f"planned failure of {tag}")


@dramatiq.actor(time_limit=500, max_retries=0)
def too_slow(tag: str) -> None:
    record("too_slow", tag, "start")
    for _ in range(30):  # short sleeps: TimeLimit's exception lands between two of them
        time.sleep(0.1)
    record("too_slow", tag)


@dramatiq.actor(max_retries=0, time_limit=120_000)
def slow(tag: str, seconds: float) -> None:
    record("slow", tag, "start")
    time.sleep(seconds)
    record("slow", tag)


@dramatiq.actor(max_retries=0)
def broken(tag: str) -> None:
    """Fails at once: a dead letter for the web page's tests."""
    record("broken", tag)
    raise ValueError(f"broken {tag}")


@dramatiq.actor
def on_ok(message: dict, result: object) -> None:
    record("on_ok", str(message["args"][0]))


@periodic(every=1, misfire="run_all")
@dramatiq.actor(queue_name="ticks")
def every_second() -> None:
    msg = CurrentMessage.get_current_message()
    record("every_second", str(msg.message_timestamp if msg else None))


@dramatiq.actor(queue_name="catchup")
def catch_up_tick(policy: str) -> None:
    """Made periodic by ``_dramatiq_scheduler`` (one entry per misfire policy)."""
    msg = CurrentMessage.get_current_message()
    record("catch_up_tick", f"{policy}:{msg.message_timestamp if msg else None}")


@dramatiq.actor(queue_name="limited", max_retries=0)
def spanned(seconds: float) -> None:
    """Record when it ran on the database clock, under ``<limit key>:<message id>``
    (tests/acceptance/test_limits.py; the spans table is tests/_spans.py's)."""
    msg = CurrentMessage.get_current_message()
    conn = _conn()
    row = conn.execute("INSERT INTO spans (task_id, pid) VALUES (%s, %s) RETURNING id",
                       (f"{msg.options.get('delayq_limit_key')}:{msg.message_id}",
                        os.getpid())).fetchone()
    time.sleep(seconds)
    conn.execute("UPDATE spans SET ended_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)"
                 "::bigint WHERE id = %s", (row[0],))
