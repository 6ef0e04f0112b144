"""``delayq move-from``: a team's waiting Celery tasks leave Redis or RabbitMQ for delayq.

A real worker on the old broker runs a few tasks, retries one, and holds countdowns of minutes
to days; while it lives the move refuses. Killed with SIGKILL, it leaves its messages
unacknowledged (Redis: in ``unacked``, for ``visibility_timeout``; RabbitMQ: requeued). More
tasks arrive with no worker: due ones, priorities, a routed queue, Celery protocol 1, and a
message that is not a Celery task. The move takes every task once, leaves the stranger where it
was, and a real worker on ``delayq+postgresql://`` then runs the due tasks once while the
countdowns wait in the table at their ETAs.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Callable
from typing import Any

import pytest
import redis

from delayq_transport.core.queue import due_ms
from delayq_transport.formats.celery import kind_for, parse_eta, protocol1_task
from delayq_transport.move.amqp_source import AmqpSource
from delayq_transport.move.redis_source import RedisSource

from ..conftest import CeleryProcess, broker_url, wait_until
from .conftest import (
    AMQP_URL,
    REDIS_URL,
    amqp_counts,
    amqp_messages,
    executions,
    outcome,
    producer,
    redis_messages,
    run_move,
    table_rows,
    wait_for_runs,
)
from .move_app import DEFAULT, REPORTS

#: Redis database 9 and RabbitMQ's default vhost (move/conftest.py), which each test empties:
#: one pytest-xdist process runs the move tests one after another (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("redis-9-rabbitmq")]

DAY = 86_400


def _publish_before_kill(url: str, database_url: str) -> dict[str, str]:
    """Tasks the old worker runs (and retries), and countdowns it takes and holds."""
    app = producer(url)
    ran = {f"I{i}": app.send_task("move_app.mark", (f"I{i}",)).id for i in range(3)}
    ran["F"] = app.send_task("move_app.flaky", ("F",)).id
    wait_for_runs(database_url, [*ran.values(), "flaky-try-0"])
    held = {
        "C1": app.send_task("move_app.mark", ("C1",), countdown=300).id,
        "C2": app.send_task("move_app.mark", ("C2",), countdown=2 * 3600, priority=5).id,
        "C3": app.send_task("move_app.report", ("C3",), countdown=3 * DAY).id,
        "C4": app.send_task("move_app.mark", ("C4",), countdown=DAY, priority=9).id,
    }
    app.close()
    return {**ran, **held}


def _publish_without_worker(url: str) -> dict[str, str]:
    """Due tasks, a short countdown, a routed queue, priorities and protocol 1."""
    app, v1 = producer(url), producer(url, protocol=1)
    ids = {
        "D1": app.send_task("move_app.mark", ("D1",)).id,
        "D2": app.send_task("move_app.mark", ("D2",), priority=3).id,
        "D3": app.send_task("move_app.report", ("D3",)).id,
        "S1": app.send_task("move_app.mark", ("S1",), countdown=15).id,
        "P1": v1.send_task("move_app.mark", ("P1",)).id,
        "P2": v1.send_task("move_app.mark", ("P2",), countdown=2 * DAY).id,
    }
    app.close()
    v1.close()
    return ids


def _check_rows(database_url: str, captured: dict[str, tuple[str, dict[str, Any]]],
                expected: dict[str, dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any], int]]:
    """Every captured task is one row in its queue's kind, at its ETA, with its message."""
    rows = table_rows(database_url)
    for tid, (queue, _) in captured.items():
        kind, stored, at = rows[tid]
        assert kind == kind_for(queue, stored["properties"].get("priority")), tid
        assert stored["headers"] == expected[tid]["headers"], tid
        assert base64.b64decode(stored["body"]) == expected[tid]["body"], tid
        eta = parse_eta(stored["headers"].get("eta") or
                        (protocol1_task(stored) or {}).get("eta"))
        if eta is not None:
            assert at == due_ms(eta), tid
    return rows


def _check_after_worker(database_url: str, ids: dict[str, str],
                        rows: dict[str, tuple[str, dict[str, Any], int]]) -> None:
    """Each due task ran once (the old worker's too), countdowns wait at their ETA."""
    due = ["D1", "D2", "D3", "S1", "P1"]
    wait_for_runs(database_url, [ids[n] for n in due])
    runs = executions(database_url)
    by_id: dict[str, list[str]] = {}
    for tid, name, _ in runs:
        by_id.setdefault(tid, []).append(name)
    for name in ["I0", "I1", "I2", *due]:
        assert len(by_id[ids[name]]) == 1, (name, by_id.get(ids[name]))
    assert by_id[ids["F"]] == ["flaky-try-0"]  # its retry waits a day in delayq
    s1_eta = parse_eta(rows[ids["S1"]][1]["headers"]["eta"])
    assert [ran for tid, _, ran in runs if tid == ids["S1"]][0] >= s1_eta
    # a task records its run before the worker acks it: its row goes soon after
    wait_until(lambda: not {ids[n] for n in due} & table_rows(database_url).keys(),
               message="the due tasks' rows to be acked")
    waiting = table_rows(database_url)
    for name in ["C1", "C2", "C3", "C4", "F", "P2"]:
        assert waiting[ids[name]][2] == rows[ids[name]][2], name


def test_redis(redis_db: redis.Redis, move_env: dict[str, str], database_url: str,
               start_move_worker: Callable[[str, str], CeleryProcess]) -> None:
    old = start_move_worker(REDIS_URL, "redis-worker")
    ids = _publish_before_kill(REDIS_URL, database_url)
    wait_until(lambda: redis_db.hlen("unacked") == 5, message="the worker to hold 5 messages")

    live = run_move(move_env, REDIS_URL, "--json")
    assert live.returncode == 1 and "still being consumed" in live.stdout + live.stderr
    assert "a consumer: client id=" in live.stdout + live.stderr
    assert redis_db.hlen("unacked") == 5 and table_rows(database_url) == {}

    old.kill(signal.SIGKILL)
    wait_until(lambda: not [c for c in redis_db.client_list()
                            if c["db"] == "9" and c["cmd"] == "brpop"],
               message="the killed worker's connections to close")
    assert redis_db.hlen("unacked") == 5  # kombu would give them back after visibility_timeout
    ids.update(_publish_without_worker(REDIS_URL))
    redis_db.lpush(DEFAULT, b'{"not": "a celery message"}', b"not json at all")
    captured = redis_messages(redis_db)
    movable = {n: ids[n] for n in ids if not n.startswith("I")}
    assert set(captured) == set(movable.values())

    plan = outcome(run_move(move_env, REDIS_URL, "--dry-run", "--json"))
    assert redis_messages(redis_db) == captured and table_rows(database_url) == {}
    by_queue = {q["queue"]: q for q in plan["queues"]}
    assert by_queue[DEFAULT]["before"] == {"waiting": 7, "unacked": 4, "staged": 0}
    assert by_queue[REPORTS]["before"] == {"waiting": 1, "unacked": 1, "staged": 0}
    assert by_queue[DEFAULT]["due"] + by_queue[REPORTS]["due"] == 4  # D1-3, P1
    assert len(by_queue[DEFAULT]["refused"]) == 2

    result = run_move(move_env, REDIS_URL, "--json")
    assert result.returncode == 1  # the two strangers stayed
    report = {q["queue"]: q for q in outcome(result)["queues"]}
    assert sum(q["moved"] for q in report.values()) == len(movable) == 11
    assert report[DEFAULT]["restored"] == 4 and report[REPORTS]["restored"] == 1
    assert report[DEFAULT]["after"] == {"waiting": 2, "unacked": 0, "staged": 0}
    assert report[DEFAULT]["delayq_after"] + report[REPORTS]["delayq_after"] == 11
    reasons = [r["reason"] for r in report[DEFAULT]["refused"]]
    assert sorted(reasons) == sorted([
        "not a kombu message (no properties)",
        "not JSON, so not a kombu message: Expecting value: line 1 column 1 (char 0)"])
    assert sorted(redis_db.lrange(DEFAULT, 0, -1)) == sorted(
        [b'{"not": "a celery message"}', b"not json at all"])
    assert redis_db.hlen("unacked") == 0 and redis_db.keys("delayq-move:*") == []
    expected = {tid: {"headers": m["headers"], "body": base64.b64decode(m["body"])}
                for tid, (_, m) in captured.items()}
    rows = _check_rows(database_url, captured, expected)
    assert rows[ids["F"]][1]["headers"]["retries"] == 1
    assert rows[ids["C3"]][0] == REPORTS and rows[ids["C4"]][0] == kind_for(DEFAULT, 9)
    for tid, (_, message) in captured.items():
        assert rows[tid][1] == message  # the very message kombu stored, bit for bit decoded

    again = outcome(run_move(move_env, REDIS_URL, "--json"))
    assert sum(q["moved"] + q["already"] for q in again["queues"]) == 0

    start_move_worker(broker_url(database_url), "delayq-worker")
    _check_after_worker(database_url, ids, rows)


def test_rabbitmq(rabbit: None, move_env: dict[str, str], database_url: str,
                  start_move_worker: Callable[[str, str], CeleryProcess]) -> None:
    old = start_move_worker(AMQP_URL, "amqp-worker")
    ids = _publish_before_kill(AMQP_URL, database_url)
    wait_until(lambda: sum(n for n, _ in amqp_counts().values()) == 0,
               message="the worker to take every message")

    live = run_move(move_env, AMQP_URL, "-Q", DEFAULT, "-Q", REPORTS, "--json")
    assert live.returncode == 1 and f"queue {DEFAULT!r} has 1 consumer" in live.stderr

    old.kill(signal.SIGKILL)
    wait_until(lambda: amqp_counts() == {DEFAULT: (4, 0), REPORTS: (1, 0)},
               message="RabbitMQ to requeue the killed worker's messages")
    ids.update(_publish_without_worker(AMQP_URL))
    import amqp

    with amqp.Connection("127.0.0.1:5672", userid="guest", password="guest") as conn:
        channel = conn.channel()
        channel.basic_publish(amqp.Message(b"hello", content_type="text/plain"),
                              routing_key=DEFAULT)
    captured = amqp_messages()
    movable = {n: ids[n] for n in ids if not n.startswith("I")}
    assert set(captured) == set(movable.values())

    plan = outcome(run_move(move_env, AMQP_URL, "-Q", DEFAULT, "-Q", REPORTS, "--dry-run",
                            "--json"))
    assert {q["queue"]: q["before"]["waiting"] for q in plan["queues"]} == {
        DEFAULT: 10, REPORTS: 2}
    assert table_rows(database_url) == {}

    result = run_move(move_env, AMQP_URL, "-Q", DEFAULT, "-Q", REPORTS, "--json")
    assert result.returncode == 1
    report = {q["queue"]: q for q in outcome(result)["queues"]}
    assert sum(q["moved"] for q in report.values()) == 11
    assert [r["reason"] for r in report[DEFAULT]["refused"]] == [
        "not a Celery task message: no task header, and the body is not a protocol-1 task in "
        "JSON (content type 'text/plain')"]
    assert amqp_counts() == {DEFAULT: (1, 0), REPORTS: (0, 0)}  # the stranger is back
    expected = {tid: {"headers": dict(m["properties"].get("application_headers") or {}),
                      "body": m["body"]} for tid, (_, m) in captured.items()}
    rows = _check_rows(database_url, captured, expected)
    assert rows[ids["F"]][1]["headers"]["retries"] == 1
    assert rows[ids["C2"]][0] == kind_for(DEFAULT, 5)
    for tid, (_, m) in captured.items():
        props = rows[tid][1]["properties"]
        assert props["correlation_id"] == m["properties"]["correlation_id"] == tid

    start_move_worker(broker_url(database_url), "delayq-worker")
    _check_after_worker(database_url, ids, rows)


def test_bad_source_urls_are_refused(move_env: dict[str, str]) -> None:
    for url, says in [("delayq+postgresql://u:secret@h/db",
                       "unknown scheme 'delayq+postgresql'"),
                      ("sqs://u:secret@h", "unknown scheme 'sqs'"),
                      ("redis://127.0.0.1:1/0", "cannot reach redis://127.0.0.1:1/0")]:
        result = run_move(move_env, url)
        assert result.returncode == 1, url
        out = " ".join((result.stdout + result.stderr).split())
        assert says in out and "secret" not in out, (url, out)




def test_one_move_at_a_time_and_unknown_queues(redis_db: redis.Redis, rabbit: None,
                                               move_env: dict[str, str]) -> None:
    """A second move of the same Redis database or RabbitMQ virtual host is refused while the
    first holds it, and so is a RabbitMQ queue that does not exist; nothing is changed."""
    redis_db.lpush(DEFAULT, b"left alone")
    first = RedisSource(REDIS_URL, REDIS_URL)
    try:
        result = run_move(move_env, REDIS_URL, "-Q", DEFAULT)
        assert result.returncode == 1
        assert "another delayq move-from is running on this database" in result.stderr
    finally:
        first.close()
    first_amqp = AmqpSource(AMQP_URL, AMQP_URL)
    try:
        result = run_move(move_env, AMQP_URL, "-Q", DEFAULT)
        assert result.returncode == 1
        assert "another delayq move-from is running on virtual host '/'" in result.stderr
    finally:
        first_amqp.close()
    result = run_move(move_env, AMQP_URL, "-Q", "dqmove.nope")
    assert result.returncode == 1
    assert "queue 'dqmove.nope' does not exist on virtual host '/'" in result.stderr
    assert redis_db.lrange(DEFAULT, 0, -1) == [b"left alone"]
