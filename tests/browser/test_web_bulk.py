"""Issue 28 in headless Chromium: bulk actions against a real Celery worker (run now on every
match: the one the worker holds is left alone and reported; cancel by checkboxes; reschedule a
timeline bar's tasks by a shift), the search that continues by itself until found or proven
absent, hatched estimated bars, and times in the viewer's zone with a remembered UTC toggle; and
(issue 42) a large selection's action in the background, followed on its page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from _bulk_pause import pause_before_the_second_batch
from acceptance.celery_app import mark, sleepy
from acceptance.conftest import executions, wait_until
from playwright.sync_api import expect

pytestmark = pytest.mark.slow


def _held(database_url: str, key: str) -> bool:
    with psycopg.connect(database_url) as conn:
        row = conn.execute('SELECT "lockUuid" FROM delayed_queue WHERE "pKey" = %s',
                           (key,)).fetchone()
    return bool(row and row[0])


def _eta(database_url: str, key: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute('SELECT "scheduledAt" FROM delayed_queue WHERE "pKey" = %s',
                           (key,)).fetchone()
    assert row is not None
    return int(row[0])


def test_bulk_actions_with_a_real_worker(database_url, producer, start_worker, web,
                                         page) -> None:
    start_worker()
    server = web()
    busy = sleepy.apply_async((6, "busy"))
    later = [mark.apply_async((f"later-{i}",), countdown=3600) for i in range(3)]
    wait_until(lambda: _held(database_url, busy.id), timeout=30, message="the worker holds it")

    # Run now on every task of the queue: a confirmation with the count, then the outcome.
    page.goto(server.url + "/tasks?queue=celery")
    page.check("#all-matching")
    expect(page.locator("#all-count")).to_have_text("(4)")
    page.click("#bulk-run-now")
    assert page.locator("#bulk-count").inner_text() == "4"
    assert "1 of them are in flight" in page.locator("#bulk-in-flight").inner_text()
    page.click("#bulk-confirm")
    flash = page.locator(".flash").inner_text()
    assert "made due now 3 task(s)" in flash and "1 in flight were left alone" in flash
    ran = wait_until(lambda: len(executions(database_url)) == 4 and executions(database_url),
                     timeout=40, message="the three made due now run (and the busy one ends)")
    assert {r["task_id"] for r in ran} == {busy.id, *(t.id for t in later)}

    # Cancel two chosen rows; the third stays.
    doomed = [mark.apply_async((f"doomed-{i}",), countdown=3600) for i in range(2)]
    kept = mark.apply_async(("kept",), countdown=7200)
    page.goto(server.url + "/tasks")
    for task in doomed:
        page.check(f"tr[data-key='{task.id}'] input.pick")
    assert page.locator("#selected-count").inner_text() == "2"
    page.click("#bulk-cancel")
    assert page.locator("#bulk-count").inner_text() == "2"
    page.click("#bulk-confirm")
    assert "cancelled 2 task(s)" in page.locator(".flash").inner_text()
    assert page.locator("#task-table tr[data-key]").count() == 1

    # A timeline bar's tasks, moved by a shift: the bar's link filters the list to its range.
    page.goto(server.url + "/?hours=6")
    before = _eta(database_url, kept.id)
    page.locator("#timeline a:has(rect.bar)").nth(16).click()  # the 2-2.25 h bucket
    assert "eta_after=" in page.url and page.locator("tr[data-key]").count() == 1
    page.check("#all-matching")
    page.fill("#bulk-shift", "-30m")
    page.click("#bulk-reschedule")
    page.click("#bulk-confirm")
    assert "rescheduled 1 task(s)" in page.locator(".flash").inner_text()
    assert _eta(database_url, kept.id) == before - 30 * 60_000


def test_search_hatching_and_time_zones(database_url, producer, web, browser,
                                        monkeypatch) -> None:
    for i in range(6):
        mark.apply_async((f"hay-{i}",), countdown=600 + i)
    needle = mark.apply_async(({"email": "Needle@example.com"},), countdown=3600)
    with psycopg.connect(database_url, autocommit=True) as conn:  # a bucket too full to count
        conn.execute("""INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",
                            "scheduledAtInitially", "createdAt")
                        SELECT 'bulk-' || g, 'reports', '\\x7b7d', a, a, 0
                        FROM generate_series(1, 1500) AS g,
                             LATERAL (SELECT (extract(epoch FROM now()) * 1000)::bigint
                                             + 5 * 3600000 + g AS a) AS x""")
        conn.execute("ANALYZE delayed_queue")
    # Slices of two rows and no time budget: the search needs several requests, which the
    # page makes by itself.
    monkeypatch.setattr("delayq_transport.browse.service.SCAN_CHUNK", 2)
    monkeypatch.setattr("delayq_transport.browse.service.SEARCH_TIME_BUDGET_S", 0.0)
    server = web()
    context = browser.new_context(timezone_id="Asia/Kolkata", viewport={"width": 1280,
                                                                        "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(server.url + "/tasks?queue=celery&q=needle@EXAMPLE")
    expect(page.locator(f"tr[data-key='{needle.id}']")).to_have_count(1)
    page.goto(server.url + "/tasks?queue=celery&q=no-such-text")
    expect(page.locator("#no-match")).to_contain_text("every row")

    page.goto(server.url + "/")
    estimated = page.locator("#timeline rect.bar.est")
    assert estimated.count() >= 1
    fill = estimated.first.evaluate("el => getComputedStyle(el).fill")
    assert "#hatch" in fill, fill  # the pattern, not the plain bar colour

    page.goto(f"{server.url}/tasks/{needle.id}")
    eta = page.locator("#task-eta time")
    due = datetime.fromisoformat(eta.get_attribute("datetime"))
    local = due.astimezone(UTC) + timedelta(hours=5, minutes=30)
    assert eta.inner_text().startswith(local.strftime("%Y-%m-%d %H:%M"))
    assert re.search(r"\(in (59|60) min\)", eta.inner_text())
    page.click("#tz-toggle")
    assert due.strftime("%Y-%m-%d %H:%M") in eta.inner_text() and "UTC" in eta.inner_text()
    page.reload()  # remembered
    assert "UTC" in page.locator("#task-eta time").inner_text()
    context.close()


def test_a_large_bulk_action_shows_its_progress_then_its_outcome(database_url, producer, web,
                                                                 page, monkeypatch) -> None:
    """Above the threshold the confirmation opens the job's page, which follows the action
    (polling its status) from the first batch to the outcome."""
    monkeypatch.setattr("delayq_transport.web.bulk.BACKGROUND_ROWS", 3)
    monkeypatch.setattr("delayq_transport.browse.bulk.BATCH", 2)  # 8 tasks: four batches
    for i in range(8):
        mark.apply_async((f"many-{i}",), countdown=3600 + i)
    server = web()
    inspector = server.server.config.app.state.delayq.service.inspector
    paused, release = pause_before_the_second_batch(monkeypatch, inspector)
    page.goto(server.url + "/tasks?queue=celery")
    page.check("#all-matching")
    expect(page.locator("#all-count")).to_have_text("(8)")
    page.click("#bulk-cancel")
    page.click("#bulk-confirm")
    assert "/tasks/bulk/jobs/" in page.url and paused.wait(30)
    expect(page.locator("#bulk-state")).to_have_text("applying")
    expect(page.locator("#bulk-percent")).to_have_text("25%")
    release.set()
    expect(page.locator("#bulk-job")).to_have_attribute("data-state", "done")
    expect(page.locator("#bulk-detail")).to_have_text("cancelled 8 task(s)")
    assert page.locator("#bulk-progress").evaluate("el => el.value") == 100
    page.click("#bulk-back")
    expect(page.locator("#task-table tr[data-key]")).to_have_count(0)
