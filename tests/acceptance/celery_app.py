"""The Celery app real worker/beat subprocesses load in acceptance tests.

Configured from the environment so each test points it at its own fresh database:
``DELAYQ_BROKER_URL`` (delayq+postgresql://...), ``DELAYQ_RESULTS_URL`` (plain postgresql URL
of the table that records executions), ``DELAYQ_TRANSPORT_OPTIONS`` (JSON).
"""

from __future__ import annotations

import json
import os
import time

import psycopg
from celery import Celery

import delayq_transport  # noqa: F401  (registers the delayq+ scheme: the one extra step)

app = Celery("acceptance")
app.conf.update(
    broker_url=os.environ.get("DELAYQ_BROKER_URL", "delayq+postgresql://postgres@127.0.0.1/test"),
    broker_transport_options=json.loads(os.environ.get("DELAYQ_TRANSPORT_OPTIONS", "{}")),
    broker_connection_retry_on_startup=True,
    task_default_queue="celery",
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=int(os.environ.get("DELAYQ_PREFETCH", "4")),
    timezone=os.environ.get("DELAYQ_TZ", "UTC"),
    enable_utc=True,
    task_acks_late=os.environ.get("DELAYQ_ACKS_LATE") == "1",
    result_backend=os.environ.get("DELAYQ_RESULT_BACKEND"),  # the web page's outcomes test
)

RESULTS_DDL = """CREATE TABLE IF NOT EXISTS executions (
    id BIGSERIAL PRIMARY KEY, task_id TEXT, name TEXT, arg TEXT, pid INT,
    redelivered BOOLEAN, eta TEXT, ran_at TIMESTAMPTZ DEFAULT clock_timestamp())"""


def record(task_id: str, name: str, arg: object, redelivered: bool = False,
           eta: str | None = None) -> None:
    with psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, name, arg, pid, redelivered, eta)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (task_id, name, json.dumps(arg), os.getpid(), redelivered, eta),
        )


@app.task(bind=True, name="celery_app.mark")
def mark(self, arg: object = None) -> object:
    """Record one execution (with its redelivery flag and ETA)."""
    info = self.request.delivery_info or {}
    record(self.request.id, "mark", arg, bool(info.get("redelivered")), self.request.eta)
    return arg


@app.task(bind=True, name="celery_app.sleepy")
def sleepy(self, seconds: float, arg: object = None) -> object:
    """Run long (to test lease extension / kills), then record."""
    time.sleep(seconds)
    info = self.request.delivery_info or {}
    record(self.request.id, "sleepy", arg, bool(info.get("redelivered")), self.request.eta)
    return arg


@app.task(bind=True, acks_late=True, name="celery_app.tagged")
def tagged(self, arg: object = None) -> object:
    """Record the lock of this task's row (acks_late: still leased while it runs), which names
    the poll that delivered it."""
    with psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True) as conn:
        row = conn.execute('SELECT "lockUuid" FROM delayed_queue WHERE "pKey" = %s',
                           (self.request.id,)).fetchone()
    record(self.request.id, "tagged", row[0] if row else None, False, None)
    return arg


@app.task(bind=True, max_retries=3, name="celery_app.flaky")
def flaky(self, arg: object = None, fail_times: int = 1, countdown: float = 1.0) -> object:
    """Fail ``fail_times`` times with Task.retry(countdown=...), then record."""
    record(self.request.id, f"flaky-try-{self.request.retries}", arg)
    if self.request.retries < fail_times:
        raise self.retry(countdown=countdown)
    record(self.request.id, "flaky", arg)
    return arg


@app.task(name="celery_app.noop")
def noop() -> None:
    return None


# -- Routing, beat and rejection knobs for test_transport_{cli,routing,delivery}.py ----------
# Each is off unless its environment variable is set, so the tests above see the same app.

from celery.exceptions import Reject  # noqa: E402
from kombu import Exchange, Queue  # noqa: E402
from kombu.common import Broadcast  # noqa: E402


def queues_from_spec(spec: list[dict[str, str]]) -> list[Queue]:
    """``[{"name", "exchange", "type", "routing_key"}]`` or ``[{"broadcast": name}]`` → Queues.

    Lets a test hand the same exchange/queue layout to worker subprocesses (as JSON in
    ``DELAYQ_TASK_QUEUES``) and to the app it publishes with.
    """
    queues: list[Queue] = []
    for item in spec:
        if "broadcast" in item:
            queues.append(Broadcast(item["broadcast"]))
            continue
        exchange = Exchange(item.get("exchange", item["name"]), type=item.get("type", "direct"))
        queues.append(Queue(item["name"], exchange, routing_key=item.get("routing_key")))
    return queues


if os.environ.get("DELAYQ_TASK_QUEUES"):
    app.conf.task_queues = queues_from_spec(json.loads(os.environ["DELAYQ_TASK_QUEUES"]))
if os.environ.get("DELAYQ_TASK_ROUTES"):
    app.conf.task_routes = json.loads(os.environ["DELAYQ_TASK_ROUTES"])
if os.environ.get("BEAT_REFRESH"):  # tests/acceptance/test_limits.py: a beat that refreshes often
    app.conf.delayq_beat_refresh_interval = float(os.environ["BEAT_REFRESH"])
    app.conf.delayq_beat_horizon = float(os.environ.get("BEAT_HORIZON", "3"))
if os.environ.get("DELAYQ_BEAT_EVERY"):
    app.conf.beat_schedule = {
        "mark-every": {"task": "celery_app.mark", "args": ("beat",),
                       "schedule": float(os.environ["DELAYQ_BEAT_EVERY"])},
    }


def rows_of(task_id: str) -> list[list[object]]:
    """The queue rows keyed by this task id, as [id, lockUuid]: shows a requeue moved no row."""
    table = json.loads(os.environ.get("DELAYQ_TRANSPORT_OPTIONS", "{}")).get(
        "table", "delayed_queue")
    with psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True) as conn:
        query = f'SELECT "id", "lockUuid" FROM "{table}" WHERE "pKey" = %s ORDER BY "id"'
        return [list(r) for r in conn.execute(query, (task_id,)).fetchall()]


@app.task(bind=True, acks_late=True, name="celery_app.reject_once")
def reject_once(self) -> None:
    """Record the task's rows, reject-and-requeue the first delivery, run the redelivery."""
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    record(self.request.id, "reject_once", rows_of(self.request.id), redelivered)
    if not redelivered:
        raise Reject("first delivery", requeue=True)


if os.environ.get("DELAYQ_METRICS_PORT"):  # test_least_privilege_worker.py: the documented hook
    from delayq_transport.metrics import install_celery_metrics

    install_celery_metrics(app, port=int(os.environ["DELAYQ_METRICS_PORT"]))


@app.task(bind=True, name="celery_app.spanned")
def spanned(self, seconds: float = 0.3) -> None:
    """Record when it started and ended on the database clock (tests/acceptance/
    test_limits.py counts how many ran at once from these spans)."""
    with psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True) as conn:
        row = conn.execute("INSERT INTO spans (task_id, pid) VALUES (%s, %s) RETURNING id",
                           (self.request.id, os.getpid())).fetchone()
        time.sleep(seconds)
        conn.execute("UPDATE spans SET ended_ms = floor(extract(epoch FROM clock_timestamp())"
                     " * 1000)::bigint WHERE id = %s", (row[0],))
