"""What the ``delayq move-from`` tests share: the source brokers (Redis DB 9, RabbitMQ queues
``dqmove.*`` on ``/``: no other test uses them), producers, the mover as a subprocess, and
reading both sides to compare them."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from celery import Celery
from kombu import Connection

from delayq_transport.formats.celery import decode, protocol1_task
from delayq_transport.move.redis_source import REFUSED, STAGED

from ..celery_app import RESULTS_DDL
from ..conftest import CeleryProcess, wait_until
from .move_app import DEFAULT, REPORTS, configure

HERE = Path(__file__).parent
ROOT = HERE.parent.parent.parent
REDIS_URL = "redis://127.0.0.1:6379/9"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
QUEUES = (DEFAULT, REPORTS)
SEP = "\x06\x16"


def source_lists(queue: str) -> list[str]:
    return [queue] + [f"{queue}{SEP}{n}" for n in range(1, 10)]


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def _drop_amqp() -> None:
    with Connection(AMQP_URL) as conn:
        channel = conn.channel()
        for name in QUEUES:
            channel.queue_delete(name)
            channel.exchange_delete(name)


@pytest.fixture
def rabbit() -> Iterator[None]:
    """Fresh ``dqmove.*`` queues (declared here: a producer whose pooled connection declared
    them in an earlier test would not declare them again)."""
    _drop_amqp()
    with Connection(AMQP_URL) as conn:
        for queue in configure(Celery("move_declare"), AMQP_URL).conf.task_queues:
            queue.bind(conn.default_channel).declare()
    yield
    _drop_amqp()


@pytest.fixture
def move_env(database_url: str) -> dict[str, str]:
    """The environment of every subprocess: the results table, this checkout first."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(RESULTS_DDL)
    env = dict(os.environ)
    env.update(DELAYQ_RESULTS_URL=database_url, DELAYQ_DATABASE_URL=database_url,
               PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")]))
    # celery runs in tests/acceptance (CeleryProcess): move_app comes from PYTHONPATH
    env.pop("DELAYQ_MOVE_CRASH", None)
    return env


@pytest.fixture
def start_move_worker(move_env: dict[str, str], tmp_path: Path
                      ) -> Iterator[Callable[[str, str], CeleryProcess]]:
    """Start a real ``celery worker`` of move_app on a broker, consuming both queues; every
    one is stopped at teardown."""
    procs: list[CeleryProcess] = []

    def start(broker_url: str, name: str) -> CeleryProcess:
        proc = CeleryProcess(
            ["-A", "move_app", "worker", "-P", "solo", "--loglevel=INFO", "-Q",
             ",".join(QUEUES), "-n", f"{name}-{os.getpid()}@%h", "--without-mingle",
             "--without-gossip"],
            dict(move_env, MOVE_BROKER_URL=broker_url), tmp_path / f"{name}.log")
        procs.append(proc)
        proc.wait_for_log("ready.", timeout=60)
        return proc

    yield start
    for proc in procs:
        proc.stop()


def producer(broker_url: str, protocol: int = 2) -> Celery:
    return configure(Celery(f"move_producer_p{protocol}"), broker_url, protocol)


def run_move(env: dict[str, str], source_url: str, *args: str,
             crash: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    run_env = dict(env, DELAYQ_MOVE_CRASH=crash) if crash else env
    return subprocess.run([sys.executable, "-m", "delayq_transport", "move-from", source_url,
                           *args], env=run_env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def outcome(result: subprocess.CompletedProcess) -> dict[str, Any]:
    """The ``--json`` report of a run that went to its end (exit 0, or 1 with refusals)."""
    assert result.returncode in (0, 1), result.stderr[-3000:]
    assert result.stdout.startswith("{"), (result.stdout[-2000:], result.stderr[-3000:])
    return json.loads(result.stdout)


def task_id(message: dict[str, Any]) -> str | None:
    headers = message.get("headers") or {}
    if headers.get("id"):
        return str(headers["id"])
    task = protocol1_task(message)
    return None if task is None else str(task["id"])


def redis_messages(client: redis.Redis) -> dict[str, tuple[str, dict[str, Any]]]:
    """task id -> (queue, message) of every Celery message in the lists and in ``unacked``,
    and in the lists where an interrupted move keeps them."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for queue in QUEUES:
        for name in source_lists(queue):
            for raw in [r for key in (name, STAGED + name, REFUSED + name)
                        for r in client.lrange(key, 0, -1)]:
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(message, dict) and (tid := task_id(message)):
                    out[tid] = (queue, message)
    for raw in client.hvals("unacked"):
        message, exchange, routing_key = json.loads(raw)
        # move_app: each exchange is named after its queue; the anonymous one routes by name
        out[task_id(message)] = (exchange or routing_key, message)
    return out


def amqp_messages() -> dict[str, tuple[str, dict[str, Any]]]:
    """task id -> (queue, {body, properties, delivery_info}) of every message in the queues,
    read with basic_get and given back (the channel closes without acking)."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    with Connection(AMQP_URL) as conn:
        channel = conn.connection.channel()
        channel.auto_decode = False
        for queue in QUEUES:
            while (m := channel.basic_get(queue, no_ack=False)) is not None:
                props = dict(m.properties)
                as_virtual = {"headers": props.get("application_headers") or {},
                              "content-type": props.get("content_type"),
                              "body": base64.b64encode(m.body).decode(),
                              "properties": {"body_encoding": "base64"}}
                tid = task_id(as_virtual)
                if tid:
                    out[tid] = (queue, {"body": m.body, "properties": props})
        channel.close()
    return out


def amqp_counts() -> dict[str, tuple[int, int]]:
    """queue -> (ready messages, consumers)."""
    with Connection(AMQP_URL) as conn:
        channel = conn.connection.channel()
        return {q: tuple(channel.queue_declare(q, passive=True)[1:]) for q in QUEUES}


def table_rows(database_url: str) -> dict[str, tuple[str, dict[str, Any], int]]:
    """pKey -> (pKind, decoded payload, scheduledAt ms) of every row."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute('SELECT "pKey", "pKind", payload, "scheduledAt" '
                            'FROM delayed_queue').fetchall()
    return {key: (kind, decode(bytes(payload)), at) for key, kind, payload, at in rows}


def executions(database_url: str) -> list[tuple[str, str, Any]]:
    """(task id, name, ran_at) of every task run, in order."""
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT task_id, name, ran_at FROM executions ORDER BY id"
                            ).fetchall()


def wait_for_runs(database_url: str, names: list[str], timeout: float = 60) -> None:
    """Until each of these task ids (or names) has run."""
    def done() -> bool:
        seen = {tid for tid, _, _ in executions(database_url)} | {
            name for _, name, _ in executions(database_url)}
        return all(n in seen for n in names)
    wait_until(done, timeout=timeout, message=f"runs of {names}")
