"""The outcome pages in headless Chromium: Dramatiq dead letters made by a real ``dramatiq``
worker (requeue runs the message again, delete drops it), and the workers page, retry labels
and result-backend outcomes with a real Celery worker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import psycopg
import pytest
from acceptance.celery_app import flaky, mark, sleepy
from acceptance.conftest import executions, wait_until
from acceptance.test_dramatiq_worker import RUNS_DDL, DramatiqWorker, runs  # noqa: E402
from playwright.sync_api import expect

from delayq_transport import DelayedQueue  # noqa: E402
from delayq_transport.browse.deadletters import DeadLetterService  # noqa: E402

#: Redis database 14, which tests/integration/test_outcomes_and_workers.py flushes too: one
#: pytest-xdist process runs both (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("redis-14")]
REDIS_URL = "redis://127.0.0.1:6379/14"
HERE = Path(__file__).resolve().parent.parent / "acceptance"


@pytest.fixture
def redis14() -> Iterator[None]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield
    client.flushdb()


@pytest.fixture
def dramatiq_worker(database_url: str, tmp_path: Path, redis14: None) -> Iterator[DramatiqWorker]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(RUNS_DDL)
    env = dict(os.environ, DELAYQ_DATABASE_URL=database_url, DELAYQ_REDIS_RESULTS=REDIS_URL,
               PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent.parent),
                                           os.environ.get("PYTHONPATH", "")]))
    worker = DramatiqWorker(["--processes", "1", "--threads", "2"], env, tmp_path / "dq.log")
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop(graceful=False)


def send_broken(database_url: str, *tags: str) -> None:
    from dramatiq.message import Message

    from delayq_transport.dramatiq import DelayqBroker

    broker = DelayqBroker(url=database_url)
    try:
        broker.declare_queue("default")
        for tag in tags:
            broker.enqueue(Message(queue_name="default", actor_name="broken", args=(tag,),
                                   kwargs={}, options={}))
    finally:
        broker.close()


def dead_count(database_url: str) -> int:
    with DelayedQueue(database_url, ensure_schema=False) as q:
        return sum(x["dead_letters"] for x in DeadLetterService(q).queues())


def test_dead_letters_requeue_and_delete(database_url: str, dramatiq_worker: DramatiqWorker,
                                         web: Any, page: Any) -> None:
    send_broken(database_url, "first", "second")
    wait_until(lambda: dead_count(database_url) == 2, timeout=30, message="two dead letters")
    server = web()
    page.goto(server.url + "/dead-letters")
    rows = page.locator("#dead-table tbody tr[data-id]")
    expect(rows).to_have_count(2)
    assert page.locator("#dead-queues tbody tr").inner_text().split() == ["default", "2"]
    rows.filter(has_text="broken first").locator("a").first.click()
    expect(page.locator("#dead-traceback")).to_contain_text("ValueError: broken first")
    page.click("#requeue")
    expect(page.locator(".flash")).to_contain_text("requeued to default")
    # It runs again in the worker (and, failing again with no retries left, comes back).
    wait_until(lambda: len(runs(database_url, "broken")) == 3, timeout=30,
               message="the requeued message runs again")
    wait_until(lambda: dead_count(database_url) == 2, timeout=30, message="dead again")
    page.goto(server.url + "/dead-letters")
    rows.filter(has_text="broken second").locator("a").first.click()
    page.click("#delete")
    expect(page.locator(".flash")).to_contain_text("deleted")
    expect(rows).to_have_count(1)
    assert "broken first" in rows.first.inner_text()
    assert dead_count(database_url) == 1


def test_workers_retries_and_outcomes(database_url: str, producer: Any, start_worker: Any,
                                      redis14: None, web: Any, page: Any) -> None:
    producer.conf.result_backend = REDIS_URL
    worker = start_worker(env={"DELAYQ_RESULT_BACKEND": REDIS_URL})
    done = mark.apply_async(("all good",))
    retried = flaky.apply_async(("again",), {"fail_times": 1, "countdown": 120})
    wait_until(lambda: len(executions(database_url)) >= 2, timeout=30, message="two runs")
    busy = sleepy.apply_async((20, "busy"))  # the solo pool holds it while it sleeps
    server = web(result_backend=REDIS_URL)

    def held() -> bool:
        page.goto(server.url + "/workers")
        return page.locator("#workers tbody tr[data-worker]").count() > 0
    wait_until(held, timeout=30, message="a worker holds the sleepy task")
    row = page.locator("#workers tbody tr[data-worker]").first
    assert "celery" in row.inner_text() and "holding" in row.inner_text()
    expect(row.locator("td.n").first).to_have_text("1")  # the sleepy task, nothing else is due
    expect(page.locator("#celery-workers")).to_contain_text("alive")
    expect(page.locator("#consumed")).to_contain_text("consumed")

    page.goto(server.url + "/tasks")
    expect(page.locator(f"tr[data-key='{busy.id}'] .state")).to_have_text("in flight")
    retry_row = page.locator(f"tr[data-key='{retried.id}']")
    expect(retry_row.locator(".badge.retry")).to_have_text("retry #1")
    retry_row.locator("a").first.click()
    expect(page.locator("#outcome-state")).to_have_text("RETRY")
    expect(page.locator("#task-state")).to_have_text("scheduled")

    page.goto(f"{server.url}/tasks/{done.id}")  # it ran: the page shows its outcome
    expect(page.locator("#outcome-state")).to_have_text("SUCCESS")
    expect(page.locator("#outcome-result")).to_contain_text("all good")
    assert page.locator("#gone").count() == 1
    worker.kill()  # not a warm shutdown: that would wait for the sleeping task
