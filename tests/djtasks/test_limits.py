"""Fleet-wide control with real ``manage.py delayq_worker`` processes (docs/how-to/limits.md):
two workers of 4 threads hold a queue's concurrency limit and a per-key one (the key: the
task's ``delayq_limit_key`` keyword argument), and a paused queue is claimed by neither until
it is resumed. What ran at once comes from the tasks' spans (tests/_spans.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
from _spans import SPANS_DDL, running_samples, spans

from delayq_transport import DelayedQueue

from .conftest import WorkerProcess, wait_until


def db_ms(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
                           ).fetchone()
    assert row is not None
    return int(row[0])


def test_two_workers_hold_a_queue_and_a_key_limit_and_a_pause(
        dj_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    from shop import djtasks

    with psycopg.connect(dj_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS spans")
        conn.execute(SPANS_DDL)
    with DelayedQueue(dj_url, kind="django:mail:0") as queue:
        queue.limit("mail", concurrency=3, key_concurrency=2)
    for key in ("acme", "bolt"):
        for _ in range(8):
            djtasks.spanned.enqueue(0.3, delayq_limit_key=key)
    for _ in range(2):
        start_worker("--threads", "4", "--queue-name", "mail")
    done = wait_until(lambda: sum(1 for *_, e in spans(dj_url) if e) == 16 and spans(dj_url),
                      "16 tasks done", timeout=60)
    assert max(n for _, n in running_samples(done)) == 3
    for key in ("acme", "bolt"):
        assert max(n for _, n in running_samples([s for s in done if s[0].startswith(key)])) <= 2
    with DelayedQueue(dj_url, kind="django:mail:0") as queue:
        queue.pause("django:mail")
        djtasks.spanned.enqueue(0.0)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert len(spans(dj_url)) == 16
            time.sleep(0.1)
        queue.resume("django:mail")
        resumed_at = db_ms(dj_url)
    found = wait_until(lambda: len(spans(dj_url)) == 17 and spans(dj_url), "the resumed task")
    assert found[-1][1] - resumed_at < 1000
