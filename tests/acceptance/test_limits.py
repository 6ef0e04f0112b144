"""Fleet-wide control with real ``celery worker`` and ``dramatiq`` processes (docs/how-to/
limits.md): a paused queue, a concurrency limit held by 4 worker processes at concurrency 4, a
killed worker's slot back with its lease, a rate limit, a limit changed while tasks run. What
ran at once comes from the tasks' own spans on the database clock (tests/_spans.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from _spans import SPANS_DDL, running_samples, share_at, spans

from delayq_transport import DelayedQueue

from .conftest import CeleryProcess, stop_together, wait_until
from .test_dramatiq_worker import app, app_env, start_worker  # noqa: F401 - its fixtures

#: Run by themselves (scripts/test's last phase): they sample running tasks every 10 ms and
#: hold a rate within 5 %, which two saturated cores beside the rest of the suite do not allow.
pytestmark = pytest.mark.alone

#: 4 processes at concurrency 4, acks late: a task's row stays leased while it runs, which is
#: what the concurrency limit counts (with early acks the row is gone before the task runs).
WORKER = ("-P", "threads", "-c", "4")
LATE = {"DELAYQ_ACKS_LATE": "1", "DELAYQ_PREFETCH": "1"}


def db_ms(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
                           ).fetchone()
    assert row is not None
    return int(row[0])


def spans_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SPANS_DDL)


def delayq(url: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "delayq_transport", "-d", url, *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def rows_of(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute('SELECT "pKey", "scheduledAt", "lockUuid" FROM delayed_queue '
                            'ORDER BY "id"').fetchall()


def test_a_paused_queue_is_claimed_by_no_worker_within_a_second_and_resumes(
        database_url: str, start_workers: Callable[..., list[CeleryProcess]],
        producer: Any) -> None:
    spans_table(database_url)
    workers = start_workers(WORKER, WORKER, env=LATE)
    assert "paused" in delayq(database_url, "queues", "pause", "celery")
    paused_at = db_ms(database_url)
    producer.send_task("celery_app.spanned", (0.01,), countdown=1.5)
    for _ in range(5):
        producer.send_task("celery_app.spanned", (0.01,))
    waiting = wait_until(lambda: len(rows_of(database_url)) == 6 and rows_of(database_url))
    deadline = time.monotonic() + 3.0  # past the countdown: still nothing claimed or moved
    while time.monotonic() < deadline:
        assert rows_of(database_url) == waiting
        time.sleep(0.1)
    assert spans(database_url) == []
    assert "resumed" in delayq(database_url, "queues", "resume", "celery")
    resumed_at = db_ms(database_url)
    found = wait_until(lambda: len(spans(database_url)) == 6 and spans(database_url))
    assert min(s for _, s, _ in found) - resumed_at < 1000  # claiming again within a second
    assert min(s for _, s, _ in found) > paused_at
    stop_together(*workers)


def test_four_workers_hold_a_concurrency_limit_and_a_killed_workers_slots_return(
        database_url: str, start_workers: Callable[..., list[CeleryProcess]],
        producer: Any) -> None:
    spans_table(database_url)
    with DelayedQueue(database_url, kind="celery") as queue:
        queue.limit("celery", concurrency=3)
    env = {**LATE, "DELAYQ_TRANSPORT_OPTIONS": json.dumps({"acquire_timeout": 2,
                                                           "polling_interval": 2})}
    workers = start_workers(WORKER, WORKER, WORKER, WORKER, env=env)
    ids = [producer.send_task("celery_app.spanned", (0.3,)).id for _ in range(60)]
    wait_until(lambda: len(spans(database_url)) >= 15)
    with psycopg.connect(database_url, autocommit=True) as conn:  # a worker running a task
        pids = {r[0] for r in conn.execute("SELECT pid FROM spans WHERE ended_ms IS NULL")}
    victim = next((w for w in workers if _pool_pid(w) in pids), workers[0])
    victim.kill()
    killed_at = db_ms(database_url)
    done = wait_until(lambda: {t for t, _, e in spans(database_url) if e is not None} >= set(ids)
                      and spans(database_url), timeout=90)
    stop_together(*[w for w in workers if w is not victim])
    samples = running_samples(done, until_ms=killed_at)
    assert max(n for _, n in samples) <= 3, max(samples, key=lambda s: s[1])
    # 3 running while 3 or more were due: from the first start to the third-last start,
    # apart from the killed worker's lease (2 s) in which its slots were still held
    starts = sorted(s for _, s, _ in done)
    busy = [x for x in samples if not killed_at <= x[0] < killed_at + 2500]
    print(f"held at most {max(n for _, n in samples)} of 3; 3 running in "
          f"{share_at(busy, 3, starts[-3]):.0%} of the 10-ms samples while 3 or more were due")
    assert share_at(busy, 3, starts[-3]) >= 0.75, share_at(busy, 3, starts[-3])


def _pool_pid(worker: CeleryProcess) -> int:
    """The threads pool runs tasks in the worker process itself."""
    return worker.proc.pid


def test_four_workers_hold_a_rate_limit(
        database_url: str, start_workers: Callable[..., list[CeleryProcess]],
        producer: Any) -> None:
    spans_table(database_url)
    with DelayedQueue(database_url, kind="celery") as queue:
        queue.limit("celery", rate="50/s")
    workers = start_workers(WORKER, WORKER, WORKER, WORKER, env=LATE)
    count = int(os.environ.get("DELAYQ_RATE_TASKS", "500"))
    for _ in range(count):
        producer.send_task("celery_app.spanned", (0.0,))
    done = wait_until(lambda: len(spans(database_url)) >= count and spans(database_url),
                      timeout=count / 50 * 3 + 30)
    stop_together(*workers)
    starts = sorted(s for _, s, _ in done)
    assert len(starts) == count  # none dropped, none twice
    per_s = (count - 5) / ((starts[-1] - starts[0]) / 1000)  # the first 5: the bucket
    print(f"rate held: {per_s:.2f}/s over {(starts[-1] - starts[0]) / 1000:.1f} s")
    assert 47.5 <= per_s <= 52.5, per_s
    # Claims are capped by the bucket (tests/integration/test_controls.py counts them); starts
    # also wait for a free thread of the worker that claimed, so short windows bunch a little.
    worst = {w: max(sum(1 for s in starts if t <= s < t + w * 1000) for t in starts)
             for w in (1, 5)}
    print(f"most starts in any 1 s: {worst[1]}, in any 5 s: {worst[5]}")
    assert worst[5] <= 5 * 50 * 1.05, worst


def test_dramatiq_workers_hold_a_per_key_limit_and_a_pause(
        app: Any, start_worker: Callable[..., Any], database_url: str) -> None:  # noqa: F811
    """2 ``dramatiq`` processes of 4 threads; a key at its limit (2) lets the other through."""
    spans_table(database_url)
    with DelayedQueue(database_url, kind="dramatiq:limited") as queue:
        queue.limit("limited", key_concurrency=2)
    for key in ("acme", "bolt"):
        for _ in range(10):
            app.spanned.send_with_options(args=(0.3,), delayq_limit_key=key)
    start_worker("--processes", "2", "--threads", "4")
    done = wait_until(lambda: sum(1 for *_, e in spans(database_url) if e) == 20
                      and spans(database_url), timeout=60)
    for key in ("acme", "bolt"):
        mine = [s for s in done if s[0].startswith(f"{key}:")]
        assert max(n for _, n in running_samples(mine)) == 2, key
    assert max(n for _, n in running_samples(done)) == 4  # both keys at their limit at once
    with DelayedQueue(database_url, kind="dramatiq:limited") as queue:
        queue.pause("dramatiq:limited")  # the front end's own name for it
        app.spanned.send_with_options(args=(0.0,), delayq_limit_key="acme")
        wait_until(lambda: queue.with_kind("dramatiq:limited").count_waiting() == 1)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert len(spans(database_url)) == 20
            time.sleep(0.1)
        queue.resume("dramatiq:limited")
        resumed_at = db_ms(database_url)
    found = wait_until(lambda: len(spans(database_url)) == 21 and spans(database_url))
    assert found[-1][1] - resumed_at < 1000


def test_limits_changed_while_tasks_run_lose_and_repeat_none(
        database_url: str, start_workers: Callable[..., list[CeleryProcess]],
        producer: Any) -> None:
    spans_table(database_url)
    workers = start_workers(WORKER, WORKER, env=LATE)
    ids = [producer.send_task("celery_app.spanned", (0.02,)).id for _ in range(150)]
    changes: list[dict[str, Any]] = [
        {"concurrency": 2}, {"rate": "40/s"}, {"concurrency": None, "key_concurrency": 1},
        {"rate": None, "key_concurrency": None}, {"concurrency": 5, "rate": "100/s"},
        {"concurrency": None, "rate": None}]
    with DelayedQueue(database_url, kind="celery") as queue:
        step = 0
        while len({t for t, _, e in spans(database_url) if e is not None}) < len(ids):
            change = changes[step % len(changes)]
            queue.limit("celery", **change)
            if step % 4 == 3:
                queue.pause("celery")
                queue.resume("celery")
            step += 1
            time.sleep(0.2)
            assert step < 300, "tasks stopped running"
    stop_together(*workers)
    found = [t for t, _, _ in spans(database_url)]
    assert sorted(found) == sorted(ids)  # each once: none lost, none run twice
    assert step >= 5


def test_beat_keeps_installing_into_a_paused_queue(
        database_url: str, start_celery: Callable[..., CeleryProcess],
        start_workers: Callable[..., list[CeleryProcess]]) -> None:
    """Pausing stops claims, not publishes: beat installs every occurrence (a 3-s horizon,
    refreshed every second), nothing runs them until the queue is resumed."""
    from .conftest import executions

    with DelayedQueue(database_url, kind="celery") as queue:
        queue.pause("celery")
    workers = start_workers(WORKER, env=LATE)
    start_celery("beat", "-S", "delayq_beat.Scheduler", "--loglevel=INFO", name="beat",
                 env={"DELAYQ_BEAT_EVERY": "1", "BEAT_REFRESH": "1", "BEAT_HORIZON": "3"},
                 ready="delayq beat: refreshed")

    def keys() -> set[str]:
        return {str(r[0]) for r in rows_of(database_url)}

    first = wait_until(keys, message="beat's first occurrences")
    wait_until(lambda: len(keys() - first) >= 3, timeout=30,
               message="beat installing more occurrences while the queue is paused")
    assert executions(database_url, "mark") == []
    with DelayedQueue(database_url, kind="celery") as queue:
        queue.resume("celery")
    wait_until(lambda: executions(database_url, "mark"), message="a tick run after resume")
    stop_together(*workers)


def test_pausing_a_flowing_queue_stops_its_claims_within_a_second(
        database_url: str, start_workers: Callable[..., list[CeleryProcess]],
        producer: Any) -> None:
    spans_table(database_url)
    with DelayedQueue(database_url, kind="celery") as queue:
        queue.limit("celery", rate="40/s")  # a steady flow of starts, 8 s of it
        workers = start_workers(WORKER, WORKER, env=LATE)
        ids = [producer.send_task("celery_app.spanned", (0.01,)).id for _ in range(320)]
        wait_until(lambda: len(spans(database_url)) >= 40)
        queue.pause("celery")
        paused_at = db_ms(database_url)
        wait_until(lambda: db_ms(database_url) > paused_at + 2500, interval=0.1)
        during = spans(database_url)
        late = [s for _, s, _ in during if s > paused_at + 1000]
        last = max(s for _, s, _ in during) - paused_at
        print(f"paused after {len(during)} starts; the last start {last} ms after the pause")
        assert late == []
        queue.resume("celery")
    done = wait_until(lambda: len(spans(database_url)) >= len(ids) and spans(database_url),
                      timeout=60)
    stop_together(*workers)
    assert sorted(t for t, _, _ in done) == sorted(ids)
