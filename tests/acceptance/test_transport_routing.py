"""Routing with real workers: task_routes and -Q, direct/topic/fanout exchanges, remote control
and events (the fanout/topic traffic of ``celery inspect``, Flower), and Redis-style priority."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kombu import Exchange

from .celery_app import mark, queues_from_spec, sleepy
from .conftest import executions, nodename, received, row_count, stop_together, wait_until

pytestmark = pytest.mark.slow

TOPIC_SPEC = [
    {"name": "dq", "exchange": "dx", "type": "direct", "routing_key": "dkey"},
    {"name": "dq2", "exchange": "dx", "type": "direct", "routing_key": "dkey"},
    {"name": "t1", "exchange": "tx", "type": "topic", "routing_key": "a.*"},
    {"name": "t2", "exchange": "tx", "type": "topic", "routing_key": "a.#"},
]
BROADCAST_SPEC = [{"name": "celery", "routing_key": "celery"}, {"broadcast": "bcast"}]


def ran_by(database_url: str) -> dict[str, list[int]]:
    """Worker pids (solo pool: the worker process itself) that ran each ``mark`` argument."""
    runs: dict[str, list[int]] = {}
    for row in executions(database_url, "mark"):
        runs.setdefault(json.loads(row["arg"]), []).append(row["pid"])
    return runs


def settled(database_url: str, dq: Any, count: int) -> dict[str, list[int]]:
    """Wait for ``count`` executions and an empty table (nothing left that could still run)."""
    wait_until(lambda: len(executions(database_url)) >= count and row_count(dq) == 0,
               timeout=20, message=f"{count} executions and an empty queue table")
    return ran_by(database_url)


def test_task_routes_and_several_queues(database_url, start_workers, make_app, dq):
    routed, default = start_workers(("-Q", "q2,extra"), ())
    app = make_app(task_routes={"celery_app.mark": {"queue": "q2"}})

    app.send_task("celery_app.mark", ("routed",))
    app.send_task("celery_app.mark", ("extra",), queue="extra")
    app.send_task("celery_app.mark", ("default",), queue="celery")

    assert settled(database_url, dq, 3) == {"routed": [routed.proc.pid],
                                             "extra": [routed.proc.pid],
                                             "default": [default.proc.pid]}
    stop_together(routed, default)


def test_direct_and_topic_exchanges(database_url, start_worker, make_app, dq):
    worker = start_worker(env={"DELAYQ_TASK_QUEUES": json.dumps(TOPIC_SPEC)})
    app = make_app(task_queues=queues_from_spec(TOPIC_SPEC))

    def send(arg: str, **route: str) -> None:
        app.send_task("celery_app.mark", (arg,), **route)

    send("to dq", queue="dq")  # Celery sends to one queue by name; declares dq (and dx) here
    # Like AMQP (and Redis), every queue bound with the key gets a copy: dq, declared by this
    # process, and dq2, bound only by the worker.
    send("dkey", exchange="dx", routing_key="dkey")
    send("a.b", queue="t1", routing_key="a.b")  # t1 (a.*) and t2 (a.#)
    send("a.b.c", queue="t1", routing_key="a.b.c")  # t2 only
    send("direct miss", exchange="dx", routing_key="other")  # unroutable: dropped, as on Redis
    send("topic miss", queue="t1", routing_key="b.a")

    wait_until(lambda: row_count(dq) == 0 and len(executions(database_url)) >= 4, timeout=20,
               message="routed copies run and acked")
    pid = worker.proc.pid
    assert ran_by(database_url) == {"to dq": [pid], "dkey": [pid, pid], "a.b": [pid, pid],
                                    "a.b.c": [pid]}


def test_broadcast_and_ping_reach_every_worker(database_url, start_workers, make_app, dq):
    env = {"DELAYQ_TASK_QUEUES": json.dumps(BROADCAST_SPEC)}
    workers = start_workers((), (), env=env)
    app = make_app(task_queues=queues_from_spec(BROADCAST_SPEC))

    replies = app.control.inspect(timeout=10, limit=2).ping()
    assert sorted(replies) == sorted(nodename(w) for w in workers)
    assert all(reply == {"ok": "pong"} for reply in replies.values())

    # A fanout exchange must be known to the publisher (kombu virtual transports, Redis too):
    # undeclared, it is taken for a direct exchange and the broadcast matches no binding.
    app.send_task("celery_app.mark", ("everyone",), queue="bcast", exchange="bcast",
                  declare=[Exchange("bcast", type="fanout")])

    assert sorted(settled(database_url, dq, 2)["everyone"]) == sorted(w.proc.pid for w in workers)
    stop_together(*workers)


class EventLog:
    """Capture events with ``app.events.Receiver`` in a thread, as ``celery events`` does."""

    def __init__(self, app: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.connection = app.connection_for_read()
        self.receiver = app.events.Receiver(self.connection, handlers={"*": self.events.append})
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.receiver.capture(limit=None, timeout=30, wakeup=False)
        except TimeoutError as exc:
            self.error = exc

    def types(self) -> set[str]:
        return {e["type"] for e in list(self.events)}

    def close(self) -> None:
        self.receiver.should_stop = True
        self.thread.join(timeout=5)
        self.connection.release()


def test_events_reach_a_receiver(database_url, producer, start_worker):
    start_worker("-E")
    log = EventLog(producer)
    try:
        # Heartbeats (every 2 s) show the receiver is bound; Flower relies on them too.
        wait_until(lambda: "worker-heartbeat" in log.types(), timeout=10, message="heartbeat")
        result = mark.delay("watched")
        succeeded = wait_until(
            lambda: [e for e in list(log.events)
                     if e["type"] == "task-succeeded" and e["uuid"] == result.id],
            timeout=15, message="task-succeeded event")
    finally:
        log.close()
    assert len(succeeded) == 1 and log.error is None
    assert {"task-received", "task-started"} <= log.types()


def test_priority_lower_number_runs_first(database_url, producer, start_worker, dq):
    worker = start_worker("-c", "1", env={"DELAYQ_PREFETCH": "1"})
    busy = sleepy.apply_async((1.5, "busy"))
    wait_until(lambda: received(worker, busy.id), timeout=15, message="busy task started")

    for priority in (9, 0, 6, 3):
        mark.apply_async((priority,), priority=priority)

    wait_until(lambda: len(executions(database_url, "mark")) == 4, timeout=15,
               message="the four prioritised tasks")
    assert [json.loads(r["arg"]) for r in executions(database_url)] == ["busy", 0, 3, 6, 9]
