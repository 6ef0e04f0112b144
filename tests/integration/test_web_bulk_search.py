"""Issue 28: bulk actions (API and page, in-flight rows left alone, eta header rewritten,
batches), search that goes on until found or the end (with and without the opt-in trigram
index), counts past the cap as ≈ estimates, throughput windows; real PostgreSQL."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from _bulk_pause import pause_before_the_second_batch
from click.testing import CliRunner

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from delayq_transport import DelayedQueue
from delayq_transport.browse import TaskFilter, TaskService, bulk
from delayq_transport.browse.rates import RateWindows
from delayq_transport.cli import main
from delayq_transport.core.inspect import search
from delayq_transport.formats.celery import decode, encode, task_message
from delayq_transport.web.app import create_app
from delayq_transport.web.security import WebConfig

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def dq(database_url: str) -> Iterator[DelayedQueue]:
    """12 tasks a minute apart from T0 (args ["user-i"]); the first one held by a consumer."""
    with DelayedQueue(database_url, kind="celery") as q:
        q.offer_batch([(f"t{i}", encode(task_message("billing.remind", [f"user-{i}"], {},
                                                     eta=T0, task_id=f"t{i}")),
                        T0 + timedelta(minutes=i)) for i in range(12)])
        yield q


def held(dq: DelayedQueue) -> None:
    with psycopg.connect(dq.db.url, autocommit=True) as conn:
        conn.execute("""UPDATE delayed_queue SET "lockUuid" = 'worker-1' WHERE "pKey" = 't0'""")


def client(dq: DelayedQueue, **options: object) -> TestClient:
    return TestClient(create_app(dq, WebConfig(**options)),  # type: ignore[arg-type]
                      base_url="http://127.0.0.1:8377")


def token(c: TestClient) -> dict[str, str]:
    return {"X-CSRF-Token": c.get("/api/csrf").json()["csrf_token"]}


def eta_header(dq: DelayedQueue, key: str) -> datetime:
    msg = dq.get(key)
    assert msg is not None
    return datetime.fromisoformat(decode(msg.payload)["headers"]["eta"])


def test_bulk_api_and_page(dq: DelayedQueue) -> None:
    held(dq)
    c = client(dq)
    window = {"eta_after": T0.isoformat(), "eta_before": (T0 + timedelta(minutes=6)).isoformat()}
    preview = c.get("/api/tasks/bulk/preview", params={**window, "all": "1"}).json()
    assert preview["count"] == 6 and preview["exact"] and preview["in_flight"] == 1
    assert c.post("/api/tasks/bulk", json={"action": "cancel", "all": True, **window}
                  ).status_code == 403  # no CSRF token
    shifted = c.post("/api/tasks/bulk", headers=token(c),
                     json={"action": "reschedule", "shift": "+2h", "all": True, **window}).json()
    assert (shifted.get("done"), shifted.get("in_flight")) == (5, 1), shifted
    assert "1 in flight were left alone" in shifted["detail"]
    moved = T0 + timedelta(hours=2, minutes=3)
    assert dq.get("t3").scheduled_at == moved and eta_header(dq, "t3") == moved  # shifted once
    assert dq.get("t0").scheduled_at != T0 + timedelta(hours=2)  # the held one stayed
    ids = [dq.get(f"t{i}").id for i in (6, 7)]  # type: ignore[union-attr]
    now = c.post("/api/tasks/bulk", headers=token(c), json={"action": "run_now", "ids": ids})
    assert now.json()["done"] == 2
    assert abs(eta_header(dq, "t6") - datetime.now(UTC)) < timedelta(minutes=1)
    at = c.post("/api/tasks/bulk", headers=token(c), json={
        "action": "reschedule", "at": "2031-01-01T00:00:00Z", "ids": ",".join(map(str, ids))})
    assert at.json()["done"] == 2 and dq.get("t7").scheduled_at == datetime(2031, 1, 1, tzinfo=UTC)
    assert c.post("/api/tasks/bulk", headers=token(c), json={"action": "explode", "ids": ids}
                  ).status_code == 400

    # The page: a confirmation with the count, then the outcome back on the list.
    form = {"csrf_token": token(c)["X-CSRF-Token"], "action": "cancel", "all": "1",
            "task": "billing.*"}
    confirm = c.post("/tasks/bulk", data=form)
    assert confirm.status_code == 200 and 'id="bulk-count">12<' in confirm.text
    assert "1 of them are in flight" in confirm.text
    done = c.post("/tasks/bulk", data={**form, "confirmed": "1"}, follow_redirects=False)
    assert done.status_code == 303 and "in+flight+were+left+alone" in done.headers["location"]
    with psycopg.connect(dq.db.url) as conn:
        assert conn.execute("SELECT count(*) FROM delayed_queue").fetchone() == (1,)
    ro = client(dq, read_only=True)
    assert ro.post("/api/tasks/bulk", headers=token(ro), json={"action": "cancel", "ids": [1]}
                   ).status_code == 403


def test_bulk_batches_and_cli_share_the_code(dq: DelayedQueue, monkeypatch) -> None:
    monkeypatch.setattr(bulk, "BATCH", 5)  # 12 rows: three statements per action
    monkeypatch.setattr(bulk, "MOVE_BATCH", 5)
    svc = TaskService(dq)
    ids = bulk.target_ids(svc, TaskFilter())
    result = bulk.apply(svc, "reschedule", ids, shift_ms=-60_000)
    assert (result.matched, result.done) == (12, 12)
    assert dq.get("t11").scheduled_at == T0 + timedelta(minutes=10)
    out = CliRunner().invoke(main, ["-d", dq.db.url, "tasks", "cancel", "-t", "billing.*",
                                    "--yes", "--json"])
    assert out.exit_code == 0 and '"cancelled": 12' in out.output


def test_search_goes_on_until_found_or_the_end(dq: DelayedQueue, monkeypatch) -> None:
    far = T0 + timedelta(days=20)
    dq.offer("needle", encode(task_message("billing.remind", [{"email": "Needle@Example.com"}],
                                           {}, task_id="needle")), far)
    svc = TaskService(dq)
    monkeypatch.setattr("delayq_transport.browse.service.SCAN_CHUNK", 4)
    monkeypatch.setattr("delayq_transport.browse.service.SEARCH_TIME_BUDGET_S", 0.0)
    page = svc.list_page(TaskFilter(text="needle@example"), None, 10)
    assert page.partial and not page.items and page.searched_to  # one slice, then progress
    c = client(dq)
    html = c.get("/tasks", params={"q": "needle@example"}).text
    assert 'id="search-progress" data-next="/tasks?' in html and "searched up to ETA" in html
    cursor = page.next_cursor
    while not page.items:  # what the page's script does: the next slice, until found
        page = svc.list_page(TaskFilter(text="needle@example"), cursor, 10)
        cursor = page.next_cursor
    assert [v.row.key for v in page.items] == ["needle"]
    monkeypatch.setattr("delayq_transport.browse.service.SEARCH_TIME_BUDGET_S", 5.0)
    none = svc.list_page(TaskFilter(text="no such thing"), None, 10)
    assert none.items == [] and none.next_cursor is None and not none.partial
    assert 'id="no-match"' in c.get("/tasks", params={"q": "no such thing"}).text

    search.create_index(dq)  # opt-in: answered from the trigram index
    assert search.index_ready(dq)
    monkeypatch.setattr("delayq_transport.browse.service.SEARCH_TIME_BUDGET_S", 0.0)
    found = svc.list_page(TaskFilter(text="needle@example"), None, 10)
    assert found.indexed and [v.row.key for v in found.items] == ["needle"]
    assert svc.list_page(TaskFilter(text="USER-11"), None, 10).items[0].row.key == "t11"
    empty = svc.list_page(TaskFilter(text="nothing-like-this"), None, 10)
    assert empty.items == [] and empty.next_cursor is None
    search.drop_index(dq)
    assert not search.index_ready(dq)


def test_counts_past_the_cap_are_estimates(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn, \
            DelayedQueue(database_url, kind="celery") as dq:
        conn.execute("""INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",
                            "scheduledAtInitially", "createdAt")
                        SELECT 'k' || g, 'celery', '\\x7b7d', 1e13::bigint + g, 1e13::bigint + g,
                               0 FROM generate_series(1, 8000) AS g""")
        conn.execute("ANALYZE delayed_queue")
        c = client(dq)
        queue = c.get("/api/overview").json()["queues"][0]
        assert queue["scheduled_estimated"] and queue["scheduled"] >= 7000, queue
        assert "≈" in c.get("/").text and "5,000+" not in c.get("/").text


def test_throughput_windows() -> None:
    rates = RateWindows()
    rates.add(0, 0, now=0.0)
    assert rates.windows() == []
    rates.add(600, 300, now=60.0)
    five, hour = rates.windows()
    assert (five["window_s"], five["span_s"], five["done_per_s"]) == (300, 60.0, 5.0)
    rates.add(1200, 600, now=400.0)
    five, hour = rates.windows()
    assert five["span_s"] == 340.0 and hour["span_s"] == 400.0  # 5 min: from the 60 s sample


def test_a_large_selection_runs_in_the_background(dq: DelayedQueue, monkeypatch) -> None:
    """Above the threshold the POST answers 202 with the job at once; its status shows the
    progress batch by batch and then the outcome; a row moved after it matched is left alone."""
    monkeypatch.setattr("delayq_transport.web.bulk.BACKGROUND_ROWS", 3)
    monkeypatch.setattr(bulk, "BATCH", 5)  # 12 rows: three batches, three commits
    held(dq)
    c = client(dq)
    inspector = c.app.state.delayq.service.inspector  # type: ignore[attr-defined]
    paused, release = pause_before_the_second_batch(monkeypatch, inspector)
    selection = {"action": "cancel", "all": True, "eta_after": T0.isoformat()}
    refused = c.post("/api/tasks/bulk", json=selection)  # no CSRF token
    assert refused.status_code == 403 and not paused.is_set()
    started = c.post("/api/tasks/bulk", headers=token(c), json=selection)
    assert started.status_code == 202, started.text
    job = started.json()
    assert started.headers["location"] == job["status_url"] == f"/api/tasks/bulk/jobs/{job['id']}"
    assert job["expected"] == 12 and not job["finished"]

    assert paused.wait(30), "the job's first batch"
    status = c.get(job["status_url"]).json()
    assert (status["state"], status["total"], status["processed"], status["percent"]) == (
        "applying", 12, 5, 41)
    assert status["result"]["in_flight"] == 1 and status["result"]["done"] == 4
    page = c.get(job["page_url"])
    assert page.status_code == 200 and 'value="41"' in page.text and "applying" in page.text
    moved = c.post(f"/api/tasks/{dq.get('t8').id}/reschedule",  # type: ignore[union-attr]
                   headers=token(c), json={"in": "3h"})
    assert moved.status_code == 200  # it no longer matches what the job collected
    release.set()

    deadline = time.monotonic() + 30
    while not (status := c.get(job["status_url"]).json())["finished"]:
        assert time.monotonic() < deadline, status
        time.sleep(0.02)
    assert status["state"] == "done" and status["percent"] == 100, status
    assert (status["result"]["done"], status["result"]["in_flight"], status["result"]["gone"]
            ) == (10, 1, 1)
    assert "cancelled 10 task(s)" in status["detail"]
    assert {k for k in ("t0", "t8") if dq.get(k)} == {"t0", "t8"}
    assert all(dq.get(f"t{i}") is None for i in range(12) if i not in (0, 8))
    assert c.get("/api/tasks/bulk/jobs/nope").status_code == 404


def test_the_page_follows_a_background_action(dq: DelayedQueue, monkeypatch) -> None:
    """The confirmation's POST redirects to the job's page, which shows the outcome."""
    monkeypatch.setattr("delayq_transport.web.bulk.BACKGROUND_ROWS", 3)
    c = client(dq)
    form = {"csrf_token": token(c)["X-CSRF-Token"], "action": "reschedule", "shift": "+1h",
            "all": "1", "queue": "celery", "confirmed": "1"}
    assert c.post("/tasks/bulk", data={k: v for k, v in form.items() if k != "csrf_token"},
                  follow_redirects=False).status_code == 403
    done = c.post("/tasks/bulk", data=form, follow_redirects=False)
    assert done.status_code == 303, done.text
    where = done.headers["location"]
    assert where.startswith("/tasks/bulk/jobs/") and "queue=celery" in where
    job_id = where.split("/")[-1].split("?")[0]
    deadline = time.monotonic() + 30
    while not (status := c.get(f"/api/tasks/bulk/jobs/{job_id}").json())["finished"]:
        assert time.monotonic() < deadline, status
        time.sleep(0.02)
    assert status["result"]["done"] == 12, status
    assert dq.get("t5").scheduled_at == T0 + timedelta(hours=1, minutes=5)  # type: ignore[union-attr]
    page = c.get(where)
    assert 'data-state="done"' in page.text and "rescheduled 12 task(s)" in page.text
