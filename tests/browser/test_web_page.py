"""The page as a person uses it, in headless Chromium: list, search, open a task, cancel it (a
real worker never runs it), reschedule one (it runs at the new time), live refresh, and the
read-only and credentials modes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from acceptance.celery_app import mark
from acceptance.conftest import executions, wait_until
from playwright.sync_api import expect

pytestmark = pytest.mark.slow


def test_list_search_open_and_cancel(database_url, producer, start_worker, web, page) -> None:
    start_worker()
    server = web()
    # The cancel below (three page loads and a POST in Chromium, a second or more each on a
    # busy 2-core box) must land before the doomed task is due: 4 s was not always enough.
    doomed = mark.apply_async(("cancel-me",), countdown=15)
    kept = mark.apply_async(("keep-me",), countdown=16)

    page.goto(server.url + "/tasks")
    rows = page.locator("#task-table tbody tr[data-key]")
    assert rows.count() == 2
    page.fill("#search", "cancel-me")
    page.click("#filters button[type=submit]")
    expect(rows).to_have_count(1)  # waits for the filtered page (click returns at its start)
    assert page.locator("td.args").inner_text().count("cancel-me") == 1

    rows.first.locator("a").first.click()
    assert "celery_app.mark" in page.locator("h1").inner_text()
    assert "cancel-me" in page.locator("#task-args").inner_text()
    page.click("#cancel")
    assert "cancelled" in page.locator(".flash").inner_text()
    assert page.locator(f"tr[data-key='{doomed.id}']").count() == 0

    wait_until(lambda: executions(database_url), timeout=40, message="the kept task runs")
    ran = [r["task_id"] for r in executions(database_url)]
    assert ran == [kept.id]  # the cancelled one was due first and still never ran


def test_reschedule_runs_at_the_new_time(database_url, producer, start_worker, web,
                                         page) -> None:
    start_worker()
    later = mark.apply_async(("move-me",), countdown=3600)
    server = web()
    page.goto(f"{server.url}/tasks/{later.id}")
    page.fill("#reschedule-in", "3s")
    before = datetime.now(UTC)
    page.click("#reschedule")
    assert "now due at" in page.locator(".flash").inner_text()
    after = datetime.now(UTC)
    new_eta = datetime.fromisoformat(page.locator(".flash").inner_text().split("now due at ")[1]
                                     .split()[0])
    ms = timedelta(milliseconds=1)
    assert before + timedelta(seconds=3) - ms <= new_eta <= after + timedelta(seconds=3)

    # Bounded: it runs at the new time, not at its old ETA an hour away.
    rows = wait_until(lambda: executions(database_url), timeout=20, message="moved task runs")
    assert rows[0]["task_id"] == later.id
    assert rows[0]["ran_at"] >= new_eta, (new_eta, rows[0]["ran_at"])  # not before it
    assert datetime.fromisoformat(rows[0]["eta"]) == new_eta  # the message's ETA moved too


def test_overview_timeline_and_live_refresh(database_url, producer, web, page) -> None:
    mark.apply_async(("soon",), countdown=600)
    server = web(refresh_s=0.5)
    page.goto(server.url + "/")
    assert page.locator("#queues tbody tr").first.inner_text().startswith("celery")
    assert page.locator("#timeline a rect.bar").count() == 48
    page.goto(server.url + "/tasks")
    assert page.locator("#task-table tbody tr[data-key]").count() == 1
    added = mark.apply_async(("appears-live",), countdown=900)
    page.locator(f"tr[data-key='{added.id}']").wait_for()  # no reload: the live refresh


def test_read_only_mode_shows_no_actions_and_refuses_posts(producer, web, page) -> None:
    task = mark.apply_async(("stay",), countdown=600)
    server = web(read_only=True)
    page.goto(f"{server.url}/tasks/{task.id}")
    assert page.locator("#mode-read-only").is_visible()
    assert page.locator("#actions").count() == 0
    status = page.evaluate(
        """async (id) => (await fetch('/api/tasks/' + id + '/cancel', {method: 'POST',
             headers: {'X-CSRF-Token': document.querySelector('meta[name=csrf-token]').content}}
           )).status""", task.id)
    assert status == 403


def test_credentials_are_required_and_work(database_url, producer, web, browser: Any) -> None:
    task = mark.apply_async(("guarded",), countdown=600)
    server = web(basic_auth="admin:correct-horse")
    anonymous = browser.new_context()
    with pytest.raises(Exception, match="ERR_INVALID_AUTH_CREDENTIALS"):
        anonymous.new_page().goto(server.url + "/tasks")  # Chromium's answer to a 401
    assert anonymous.request.get(server.url + "/api/tasks").status == 401
    anonymous.close()

    context = browser.new_context(http_credentials={"username": "admin",
                                                    "password": "correct-horse"})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{server.url}/tasks/{task.id}")
    page.click("#cancel")
    assert re.search("cancelled", page.locator(".flash").inner_text())
    context.close()
    with psycopg.connect(database_url) as conn:
        left = conn.execute('SELECT count(*) FROM delayed_queue WHERE "pKey" = %s',
                            (task.id,)).fetchone()
    assert left == (0,)




def test_demo_prints_the_page_and_it_shows_tasks_go_scheduled_to_done(database_url,
                                                                      page) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="400")
    demo = subprocess.Popen(
        [sys.executable, "-m", "delayq_transport", "-d", database_url, "demo", "--web-port", "0",
         "--linger", "60"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)
    try:
        watch_url = None
        assert demo.stdout is not None
        for line in demo.stdout:
            found = re.search(r"(http://127\.0\.0\.1:\d+/watch\?ids=\S+)", line)
            if found:
                watch_url = found.group(1)
                break
        assert watch_url, "the demo printed no watch URL"
        page.goto(watch_url)
        rows = page.locator("#watch-table tbody tr")
        assert rows.count() == 6
        page.locator("tr[data-state='scheduled']").first.wait_for()  # seen waiting...
        done = page.locator("#watch-table tr[data-state='done']")
        expect(done).to_have_count(6, timeout=45_000)  # ...then done, by live refresh alone
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(timeout=60)
