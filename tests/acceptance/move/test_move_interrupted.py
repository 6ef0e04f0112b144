"""``delayq move-from`` killed with SIGKILL at every step, then run again: each task ends in
delayq exactly once, even when a worker ran the moved rows between the crash and the re-run.

``DELAYQ_MOVE_CRASH=<point>:<n>`` makes the mover kill itself at a point of its order of
operations (delayq_transport/move/mover.py); ``DELAYQ_MOVE_CRASH=inside:<step>:<n>`` kills it
at a seeded random point inside a step (the n-th Python call or return in it: between a
commit and the next line, between two Redis commands, ...), so a reordering inside a batch
that opens a window for a duplicate or a loss is found too; one test also kills it from
outside in the middle of a large move.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import redis
from kombu import Connection

from delayq_transport import DelayedQueue
from delayq_transport.formats.celery import kinds_for
from delayq_transport.move.amqp_source import LOCK_QUEUE
from delayq_transport.move.mover import CRASH_ENV
from delayq_transport.move.redis_source import CLIENT_NAME, UNACKED_MUTEX

from ..conftest import CeleryProcess, wait_until
from .conftest import (
    AMQP_URL,
    QUEUES,
    REDIS_URL,
    ROOT,
    amqp_counts,
    amqp_messages,
    outcome,
    producer,
    redis_messages,
    run_move,
    table_rows,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("redis-9-rabbitmq")]  # test_move_from.py

KINDS = [k for q in QUEUES for k in kinds_for(q)]
BATCH = "7"


def _publish(url: str, n: int, first: int = 0, due: bool = True) -> list[str]:
    """n tasks over both queues: due ones, countdowns from minutes to days, priorities."""
    app = producer(url)
    ids = []
    for i in range(first, first + n):
        countdown = None if due and i % 3 == 0 else 60 * (1 + i % 500) ** 2  # 1 min to 6 mo
        name = "move_app.report" if i % 5 == 0 else "move_app.mark"
        ids.append(app.send_task(name, (i,), countdown=countdown, priority=i % 10).id)
    app.close()
    return ids


def _source_ids(broker: str, client: redis.Redis | None) -> set[str]:
    return set(redis_messages(client) if client is not None else amqp_messages())


def _wait_mover_gone(broker: str, client: redis.Redis | None) -> None:
    """The killed mover's connection is closed (its lock with it) before the next run."""
    if client is not None:
        wait_until(lambda: not [c for c in client.client_list()
                                if c["name"].startswith(CLIENT_NAME)],
                   message="the killed mover's Redis connections to close")
        return

    def unlocked() -> bool:
        import amqp

        with Connection(AMQP_URL) as conn:
            try:
                conn.connection.channel().queue_declare(LOCK_QUEUE, passive=True)
            except amqp.exceptions.NotFound:
                return True
        return False

    wait_until(unlocked, message="the killed mover's AMQP connection to close")


def _run_due(database_url: str) -> set[str]:
    """A worker's part, done directly: take every due row and ack it (the task ran)."""
    with DelayedQueue(database_url, ensure_schema=False) as queue:
        ran = set()
        while envs := queue.try_poll_many(100, KINDS):
            queue.ack_many(envs)
            ran |= {e.key for e in envs}
        return ran


def _check_exactly_once(database_url: str, ids: list[str], ran: set[str]) -> None:
    with psycopg.connect(database_url) as conn:
        per_key = dict(conn.execute('SELECT "pKey", count(*) FROM delayed_queue GROUP BY 1'
                                    ).fetchall())
    assert set(per_key.values()) <= {1}
    assert not per_key.keys() & ran, "a task that ran was moved in again"
    assert per_key.keys() | ran == set(ids)


def _broker(request: pytest.FixtureRequest, name: str) -> tuple[str, redis.Redis | None]:
    if name == "redis":
        return REDIS_URL, request.getfixturevalue("redis_db")
    request.getfixturevalue("rabbit")
    return AMQP_URL, None


#: Crash sequences; every point is reached (Redis moves 80 messages, RabbitMQ 60, by 7).
CRASHES = [["restored:1"], ["staged:1"], ["offered:28"], ["removed:1"],
           ["staged:15", "offered:10", "removed:10", "offered:8"]]
CASES = [(name, crashes) for name in ("redis", "amqp") for crashes in CRASHES
         # RabbitMQ requeues a dead worker's messages itself: there is nothing to restore
         if not (name == "amqp" and crashes == ["restored:1"])]


@pytest.mark.parametrize(("broker_name", "crashes"), CASES,
                         ids=[f"{b}-{'+'.join(c)}" for b, c in CASES])
def test_killed_at_each_step_then_run_again(
        request: pytest.FixtureRequest, broker_name: str, crashes: list[str],
        move_env: dict[str, str], database_url: str,
        start_move_worker: Callable[[str, str], CeleryProcess]) -> None:
    url, client = _broker(request, broker_name)
    args = ["-Q", QUEUES[0], "-Q", QUEUES[1], "--batch-size", BATCH, "--json"]
    if client is not None:  # a killed worker's countdowns wait in unacked
        old = start_move_worker(url, "redis-worker")
        ids = _publish(url, 20, first=1000, due=False)
        wait_until(lambda: client.hlen("unacked") == 20, message="20 messages held")
        old.kill(signal.SIGKILL)
        wait_until(lambda: not [c for c in client.client_list() if c["cmd"] == "brpop"
                                and c["db"] == "9"], message="the worker's connections gone")
    else:
        ids = []
    ids += _publish(url, 60)
    assert _source_ids(url, client) == set(ids)

    ran: set[str] = set()
    for crash in crashes:
        result = run_move(move_env, url, *args, crash=crash)
        assert result.returncode == -signal.SIGKILL, (crash, result.stdout, result.stderr)
        _wait_mover_gone(url, client)
        in_table, in_source = set(table_rows(database_url)), _source_ids(url, client)
        assert (in_source | in_table | ran) == set(ids), f"lost after {crash}"
        ran_now = _run_due(database_url)  # a delayq worker runs what was moved so far
        if crash == "offered:28":  # the case the ledger is for: run, and still in the source
            assert ran_now & in_source
        ran |= ran_now

    final = outcome(run_move(move_env, url, *args))
    assert final["leftovers"] == [] and all(q["refused"] == [] for q in final["queues"])
    assert _source_ids(url, client) == set()
    if client is not None:
        assert client.keys("delayq-move:*") == [] and client.hlen("unacked") == 0
    else:
        assert amqp_counts() == {q: (0, 0) for q in QUEUES}
    _check_exactly_once(database_url, ids, ran)


#: Python calls and returns counted inside each step, up to which a kill is drawn: about two
#: batches' worth of that step (a move of 60 tasks by 7 made, on either broker: take 55-80k,
#: offer 15k, settle 6-7k, forget 2.7-2.9k; restore ~500 with nothing to restore, more with
#: unacked messages), so each of the kills of a case lands inside the step, not after the move.
INSIDE_CAP = {"restore": 400, "take": 12000, "offer": 3000, "settle": 1300, "forget": 600}
KILLS_PER_CASE = 3
SEEDS = range(3)
INSIDE_CASES = [(name, step, seed) for name in ("redis", "amqp") for step in INSIDE_CAP
                for seed in SEEDS
                # RabbitMQ requeues a dead worker's messages itself: there is nothing to restore
                if not (name == "amqp" and step == "restore")]


@pytest.mark.parametrize(("broker_name", "step", "seed"), INSIDE_CASES,
                         ids=[f"{b}-{s}-seed{n}" for b, s, n in INSIDE_CASES])
def test_killed_at_random_points_inside_each_step(
        request: pytest.FixtureRequest, broker_name: str, step: str, seed: int,
        move_env: dict[str, str], database_url: str,
        start_move_worker: Callable[[str, str], CeleryProcess]) -> None:
    """Three SIGKILLs per case at seeded random points inside one step, a worker running
    what was moved after each, then a run to the end: every task is in delayq or ran, once."""
    rng = random.Random(f"{broker_name}-{step}-{seed}")  # a failure reruns the same kills
    url, client = _broker(request, broker_name)
    args = ["-Q", QUEUES[0], "-Q", QUEUES[1], "--batch-size", BATCH, "--json"]
    ids = []
    if step == "restore":  # a killed worker's messages wait in unacked, for each run
        old = start_move_worker(url, "redis-worker")
        ids += _publish(url, 20, first=1000, due=False)
        wait_until(lambda: client.hlen("unacked") == 20, message="20 messages held")
        old.kill(signal.SIGKILL)
        wait_until(lambda: not [c for c in client.client_list() if c["cmd"] == "brpop"
                                and c["db"] == "9"], message="the worker's connections gone")
    ids += _publish(url, 120)
    assert _source_ids(url, client) == set(ids)

    ran: set[str] = set()
    kills = 0
    for _ in range(KILLS_PER_CASE):
        n = rng.randint(1, INSIDE_CAP[step])
        result = run_move(move_env, url, *args, crash=f"inside:{step}:{n}")
        if result.returncode == 1 and UNACKED_MUTEX in result.stderr + result.stdout:
            # Killed inside the restore while holding kombu's restore lock: refused until the
            # lock expires (300 s), as kombu's own restore is. Expire it now.
            assert client is not None and client.ttl(UNACKED_MUTEX) > 0
            client.delete(UNACKED_MUTEX)
            continue
        assert result.returncode == -signal.SIGKILL, (n, result.stdout, result.stderr[-3000:])
        assert f"{CRASH_ENV}: killed inside step {step}" in result.stderr, result.stderr[-3000:]
        kills += 1
        _wait_mover_gone(url, client)
        in_table, in_source = set(table_rows(database_url)), _source_ids(url, client)
        assert (in_source | in_table | ran) == set(ids), f"lost after a kill inside {step} ({n})"
        ran |= _run_due(database_url)  # a delayq worker runs what was moved so far
    assert kills >= 1, "no kill landed inside the step"

    final = outcome(run_move(move_env, url, *args))
    assert final["leftovers"] == [] and all(q["refused"] == [] for q in final["queues"])
    assert _source_ids(url, client) == set()
    _check_exactly_once(database_url, ids, ran)


@pytest.mark.parametrize("broker_name", ["redis", "amqp"])
def test_killed_from_outside_during_a_large_move(
        request: pytest.FixtureRequest, broker_name: str, move_env: dict[str, str],
        database_url: str) -> None:
    url, client = _broker(request, broker_name)
    ids = _publish(url, 3000)
    args = ["-Q", QUEUES[0], "-Q", QUEUES[1], "--batch-size", "50", "--json"]
    mover = subprocess.Popen([sys.executable, "-m", "delayq_transport", "move-from", url,
                              *args], env=move_env, cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: len(table_rows(database_url)) >= 300, timeout=120,
                   message="the move to be under way")
    finally:
        mover.send_signal(signal.SIGKILL)
        mover.wait(timeout=30)
    _wait_mover_gone(url, client)
    moved_before = len(table_rows(database_url))
    assert moved_before < len(ids), "killed too late to test anything"
    ran = _run_due(database_url)
    final: dict[str, Any] = outcome(run_move(move_env, url, *args))
    assert sum(q["moved"] + q["already"] for q in final["queues"]) >= len(ids) - moved_before
    assert _source_ids(url, client) == set()
    _check_exactly_once(database_url, ids, ran)
