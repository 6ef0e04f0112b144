"""Wake-ups (issue 3, item 4): NOTIFY for due-now rows, a timer for the earliest scheduledAt,
a slow fallback poll for missed notifications, and an idle worker that leaves the database be.

Consumers run with a fallback poll of 30 s where the point is that something *else* woke them:
a delivery within the few seconds a test waits for it (``drain_events(timeout=...)``, which
raises when nothing came) can then only come from NOTIFY or the due-time timer. How fast they
come is measured in bench/ (``bench/run.py``'s latency scenario: pick-up and lateness).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import kombu
import psycopg
import psycopg.sql
import pytest
from conftest import BASE_URL
from kombu.asynchronous.hub import Hub

from delayq_transport import DelayedQueue
from delayq_transport.core.db.queries import notify_channel
from delayq_transport.formats import celery as msg

from .conftest import executions, nodename, wait_until

pytest_plugins = ("_kombu_env",)

Connect = Callable[..., kombu.Connection]
PUBLISHER = Path(__file__).parent.parent / "_kombu_publish.py"
#: The fallback poll of the consumers below: far longer than any wait a test accepts.
SLOW_POLL_S = 30.0
#: How long a task waiting in a queue added with ``add_consumer`` may take to run.
ADDED_QUEUE_BOUND_S = 5.0


@contextmanager
def consuming(conn: kombu.Connection, queue: str) -> Iterator[list[tuple[float, Any]]]:
    """Consume ``queue``; yields (wall-clock receive time, body) pairs as they arrive."""
    received: list[tuple[float, Any]] = []

    def on_message(body: Any, message: kombu.Message) -> None:
        received.append((time.time(), body))
        message.ack()

    with kombu.Consumer(conn, [kombu.Queue(queue, routing_key=queue)], callbacks=[on_message]):
        with pytest.raises(socket.timeout):  # first poll done, nothing due: now idle
            conn.drain_events(timeout=0.2)
        yield received


def iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def offer_task(q: DelayedQueue, name: str, *, via_trigger: bool = False) -> float:
    """Insert a due-now task row with the core API; returns the wall time just before.
    ``via_trigger``: a plain INSERT (as psql or another library writes), whose wake-up is the
    insert trigger's (``offer`` and ``offer_batch`` announce theirs after the commit)."""
    payload = msg.encode(msg.task_message("t.wake", [name], task_id=name, queue=q.kind))
    started = time.time()
    if via_trigger:
        insert = psycopg.sql.SQL(
            'INSERT INTO {} ("pKey", "pKind", payload, "scheduledAt", "scheduledAtInitially", '
            '"createdAt") VALUES (%s, %s, %s, %s, %s, %s)').format(
                psycopg.sql.Identifier(q.table))
        at = int(started * 1000)
        q.db.run(lambda conn: conn.execute(insert, (name, q.kind, payload, at, at, at)))
    else:
        q.offer(name, payload)
    return started


def queue_of(url: str, table: str, kind: str) -> DelayedQueue:
    return DelayedQueue(url, kind=kind, table=table, ensure_schema=False)


def test_notify_wakes_an_idle_consumer_at_once(kombu_connect: Connect, kombu_db: str,
                                               kombu_table: str):
    with kombu_connect(polling_interval=SLOW_POLL_S) as conn, consuming(conn, "wake") as got, \
            queue_of(kombu_db, kombu_table, "wake") as q:
        for i in range(5):
            timer = threading.Timer(0.1, offer_task, (q, f"w{i}"))
            timer.start()  # the insert comes once this thread is blocked in drain_events
            conn.drain_events(timeout=5)  # bounded: the fallback poll would take 30 s
            timer.join()
    assert [body[0] for _, body in got] == [[f"w{i}"] for i in range(5)]


def terminate_listen_backend(url: str, table: str) -> None:
    """Kill the consumer's LISTEN session server-side (idle timeout, proxy, failover...)."""
    with psycopg.connect(url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = %s",
            (f'LISTEN "{notify_channel(table)}"',)).fetchall()
    assert killed == [(True,)], killed


def run_hub(hub: Hub, until: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        hub.run_once()


@pytest.mark.parametrize("mode", ["drain_events", "hub"])
def test_consumer_listens_again_after_its_listen_connection_is_killed(
    mode: str, kombu_connect: Connect, kombu_db: str, kombu_table: str
):
    """Only the LISTEN session dies: the consumer reconnects it and NOTIFY keeps waking it."""
    hub = Hub()
    with kombu_connect(polling_interval=SLOW_POLL_S) as conn, consuming(conn, "relisten") as got, \
            queue_of(kombu_db, kombu_table, "relisten") as q:
        if mode == "hub":
            conn.register_with_event_loop(hub)
            run_hub(hub, lambda: False, 0.2)
        terminate_listen_backend(kombu_db, kombu_table)
        if mode == "hub":
            run_hub(hub, lambda: False, 0.3)  # the loop sees the dead socket
        else:
            with pytest.raises(socket.timeout):
                conn.drain_events(timeout=0.3)
        offer_task(q, "after-kill")
        if mode == "hub":  # bounded waits: the fallback poll would take 30 s
            run_hub(hub, lambda: bool(got), 3)
        else:
            conn.drain_events(timeout=3)
        hub.close()
    assert [body[0] for _, body in got] == [["after-kill"]]


def publish_from_another_process(url: str, table: str, queue: str, body: str,
                                 countdown: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(PUBLISHER), url, table, queue, body, "--countdown", str(countdown)],
        stdout=subprocess.PIPE, text=True,
    )


def test_countdown_known_before_waiting_is_delivered_at_its_time(kombu_connect: Connect):
    """The consumer learns the earliest scheduledAt on its idle poll and sets a timer for it."""
    with kombu_connect(polling_interval=SLOW_POLL_S) as conn:
        queue = kombu.Queue("cd", routing_key="cd")
        channel = conn.default_channel  # connect (migrating the fresh table) before the eta
        eta = time.time() + 2
        kombu.Producer(channel).publish("two", routing_key="cd",
                                                     headers={"eta": iso(eta)}, declare=[queue])
        with consuming(conn, "cd") as got:
            conn.drain_events(timeout=6)  # bounded: the fallback poll would take 30 s
    [(at, body)] = got
    assert body == "two"
    assert at >= eta - 0.02, at - eta  # not before its ETA


def test_countdown_inserted_by_another_process_while_waiting(kombu_connect: Connect,
                                                             kombu_db: str, kombu_table: str):
    """A NOTIFY carrying a future scheduledAt moves the consumer's timer earlier."""
    with kombu_connect(polling_interval=SLOW_POLL_S) as conn:
        queue = kombu.Queue("cd2", routing_key="cd2")
        kombu.Producer(conn.default_channel).publish(
            "far", routing_key="cd2", headers={"eta": iso(time.time() + 60)}, declare=[queue])
        with consuming(conn, "cd2") as got:
            proc = publish_from_another_process("delayq+" + kombu_db, kombu_table, "cd2", "near",
                                                countdown=2)
            conn.drain_events(timeout=8)
            out, _ = proc.communicate(timeout=30)
    published = json.loads(out)
    [(at, body)] = got
    assert body == "near"  # within the bounded wait: the far row's timer says 60 s
    assert at >= published["eta"] - 0.02, at - published["eta"]  # not before its ETA


def test_fallback_poll_finds_a_row_whose_notify_was_suppressed(kombu_connect: Connect,
                                                               kombu_db: str, kombu_table: str):
    """Triggers do not fire for a session in replica mode: only the fallback poll can see a row
    whose wake-up is the insert trigger's."""
    poll_s = 1.5
    silent_url = kombu_db + "?options=" + quote("-c session_replication_role=replica")
    with psycopg.connect(kombu_db, autocommit=True) as listener, \
            kombu_connect(polling_interval=poll_s) as conn, consuming(conn, "quiet") as got, \
            queue_of(kombu_db, kombu_table, "elsewhere") as loud, \
            queue_of(silent_url, kombu_table, "quiet") as silent:
        listener.execute(f'LISTEN "{notify_channel(kombu_table)}"')
        offer_task(loud, "control")  # NOTIFY works...
        assert [n.payload.split(":")[0] for n in listener.notifies(timeout=2, stop_after=1)] \
            == ["elsewhere"]
        offer_task(silent, "silent", via_trigger=True)  # ...but not for this session
        conn.drain_events(timeout=poll_s + 2)  # bounded: one fallback poll and some
        assert list(listener.notifies(timeout=0.1)) == []
    [(_, body)] = got
    assert body[0] == ["silent"]


@pytest.mark.slow
def test_worker_hub_wakes_on_notify_and_on_the_due_timer(
    database_url: str, producer: Any, start_worker: Callable[..., Any]
):
    """In the worker, the LISTEN socket and the due-time timer live in the kombu hub."""
    start_worker(env={"DELAYQ_TRANSPORT_OPTIONS": json.dumps({"polling_interval": SLOW_POLL_S})})
    now = producer.send_task("celery_app.mark", ("now",))
    # The ETA the message carries (given as eta=), not a clock read beside the publish.
    eta_at = datetime.now(UTC) + timedelta(seconds=2)
    later = producer.send_task("celery_app.mark", ("later",), eta=eta_at)
    eta = eta_at.timestamp()
    # Bounded: the fallback poll would take 30 s.
    runs = wait_until(lambda: len(executions(database_url)) >= 2 and executions(database_url),
                      timeout=10, message="both tasks to run")
    ran = {r["task_id"]: r["ran_at"].timestamp() for r in runs}
    assert set(ran) == {now.id, later.id}
    assert ran[later.id] >= eta - 0.05, ran[later.id] - eta  # not before its ETA


@pytest.mark.slow
def test_add_consumer_runs_a_task_already_waiting_in_the_added_queue(
    database_url: str, producer: Any, start_worker: Callable[..., Any]
):
    """``celery control add_consumer`` at run time: the task waiting in the added queue was
    announced before anyone consumed it, so only polling the added queue at once runs it
    before the fallback poll (30 s here)."""
    worker = start_worker(env={"DELAYQ_TRANSPORT_OPTIONS": json.dumps(
        {"polling_interval": SLOW_POLL_S})})
    node = nodename(worker)
    waiting = producer.send_task("celery_app.mark", ("waiting",), queue="added")
    assert executions(database_url) == []  # the worker consumes "celery" only

    reply = producer.control.add_consumer("added", destination=[node], reply=True, timeout=10)
    assert reply == [{node: {"ok": "add consumer added"}}], reply

    [run] = wait_until(lambda: executions(database_url), timeout=ADDED_QUEUE_BOUND_S,
                       message="the task waiting in the added queue to run")
    assert run["task_id"] == waiting.id


IDLE_WINDOW_S = 5.0
#: PostgreSQL publishes a backend's counters at most once a second while it is busy, and at the
#: latest 10 s after it went idle: let the worker's start-up burst land before the window opens.
STATS_SETTLE_S = 10.0


def commits(dbname: str) -> int:
    """Transactions committed in one database (every delayq statement is one, autocommit)."""
    with psycopg.connect(BASE_URL, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                           (dbname,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
def test_idle_worker_runs_the_async_loop_and_leaves_the_database_alone(
    database_url: str, producer: Any, start_worker: Callable[..., Any]
):
    options = {"polling_interval": 5, "acquire_timeout": 10}
    worker = start_worker("-I", "_kombu_tasks",
                          env={"DELAYQ_TRANSPORT_OPTIONS": json.dumps(options)})
    ready = time.monotonic()
    producer.send_task("kombu_tasks.loop_probe")
    [probe] = wait_until(lambda: executions(database_url, "loop-probe"), message="loop probe")
    assert json.loads(probe["arg"]) == ["asynloop"], probe["arg"]
    dbname = database_url.rsplit("/", 1)[1]
    # Fixed spans, not waits for an event: the settling time of PostgreSQL's statistics, then
    # the observation window itself.
    time.sleep(max(0.0, STATS_SETTLE_S - (time.monotonic() - ready)))
    before, t0 = commits(dbname), time.monotonic()
    time.sleep(IDLE_WINDOW_S)
    after, elapsed = commits(dbname), time.monotonic() - t0
    rate = (after - before) / elapsed
    print(f"idle worker: {after - before} commits in {elapsed:.1f}s = {rate:.2f}/s")
    assert worker.proc.poll() is None
    assert rate < 5, rate


def test_a_backlogged_consumer_reads_wakeups_on_a_timer_and_loses_none(
    kombu_connect: Connect, kombu_db: str, kombu_table: str
):
    """While a channel has a backlog the LISTEN socket leaves the event loop and is read every
    DEAF_READ_INTERVAL_S: another channel's wake-up then still arrives (the fallback poll
    is 30 s), and once the backlog is gone the socket is back and a publish wakes at once."""
    n, hub = 400, Hub()
    seen_deaf: list[bool] = []
    busy_got: list[str] = []
    other_got: list[float] = []
    still_busy: list[bool] = []
    with kombu_connect(polling_interval=SLOW_POLL_S) as conn, \
            queue_of(kombu_db, kombu_table, "busy") as busy, \
            queue_of(kombu_db, kombu_table, "other") as other:
        conn.connect()  # creates this test's table
        wakeups = conn.transport.session

        def on_busy(body: Any, message: kombu.Message) -> None:
            seen_deaf.append(wakeups.deaf and wakeups.listener.fd not in hub.readers)
            busy_got.append(body[0][0])
            time.sleep(0.005)  # the backlog lasts ~2 s
            message.ack()

        def on_other(body: Any, message: kombu.Message) -> None:
            other_got.append(time.time())
            still_busy.append(wakeups.deaf and len(busy_got) < n)
            message.ack()

        busy.offer_batch([(f"b{i}", msg.encode(msg.task_message(
            "t.wake", [f"b{i}"], task_id=f"b{i}", queue="busy")), None) for i in range(n)])
        conn.register_with_event_loop(hub)
        with kombu.Consumer(conn, [kombu.Queue("busy", routing_key="busy")],
                            callbacks=[on_busy], prefetch_count=4), \
                kombu.Consumer(conn.channel(), [kombu.Queue("other", routing_key="other")],
                               callbacks=[on_other]):
            run_hub(hub, lambda: len(busy_got) >= 20, 10)
            assert wakeups.deaf, "20 deliveries into a backlog of 400 and still reading each"
            offer_task(other, "while-busy")
            run_hub(hub, lambda: bool(other_got), 5)  # bounded: the fallback poll takes 30 s
            run_hub(hub, lambda: len(busy_got) >= n, 20)
            run_hub(hub, lambda: not wakeups.deaf, 5)
            assert wakeups.listener.fd in hub.readers
            offer_task(busy, "after-backlog")
            run_hub(hub, lambda: len(busy_got) > n, 5)  # bounded, as above
        hub.close()
    assert other_got, "the timer read never handed it out"
    assert still_busy == [True], "handed out only once the backlog was gone"
    assert sorted(busy_got[:n]) == sorted(f"b{i}" for i in range(n))  # each once
    assert busy_got[n:] == ["after-backlog"]
    assert any(seen_deaf), "never read on the timer"
    # The timer read is the only way in while deaf; the last message woke the consumer itself
    # (run_hub's bound above: the fallback poll would take 30 s).
