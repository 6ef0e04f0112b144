"""The page's failed and retrying tasks (``/failed``, ``/api/failed``) over HTTP (Starlette's
test client, real PostgreSQL): the list, retry and discard behind CSRF, refused in read-only
mode, and the outcome page's buttons for a failed django.tasks task."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

import pytest
from test_failures import celery_retry, run_django

with warnings.catch_warnings():  # starlette 1.x nudges toward httpx2; httpx works the same
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from delayq_transport import DelayedQueue
from delayq_transport.core import TaskResults
from delayq_transport.web.app import create_app
from delayq_transport.web.security import WebConfig


@pytest.fixture
def dq(database_url: str) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind="django:default:0") as q:
        run_django(q, "d1", "shop.charge", fails=True)
        run_django(q, "d2", "shop.mail", fails=True, queue_name="mail")
        run_django(q, "r1", "shop.charge", fails=True, retry=True)
        run_django(q, "periodic/abc/1700000000000", "shop.sweep", fails=True)
        yield q


def client(dq: DelayedQueue, **options: object) -> TestClient:
    return TestClient(create_app(dq, WebConfig(**options)),  # type: ignore[arg-type]
                      base_url="http://127.0.0.1:8377")


def token(c: TestClient) -> str:
    return str(c.get("/api/csrf").json()["csrf_token"])


def test_the_failed_page_lists_retries_and_discards(dq: DelayedQueue) -> None:
    c = client(dq)
    page = c.get("/failed")
    assert page.status_code == 200
    assert re.findall(r'data-ref="([^"]+)"', page.text) == \
        ["periodic/abc/1700000000000", "d2", "d1"]
    assert "ValueError: d1 for good" in page.text and 'href="/outcomes/d1"' in page.text
    assert 'data-ref="r1"' not in page.text
    retrying = c.get("/failed", params={"state": "retrying"})
    assert re.findall(r'data-key="([^"]+)"', retrying.text) == ["r1"]
    mail = c.get("/failed", params={"queue": "mail"})
    assert re.findall(r'data-ref="([^"]+)"', mail.text) == ["d2"]
    # Without the CSRF token: refused, nothing changed.
    refused = c.post("/failed/retry", data={"id": "d1"})
    assert refused.status_code == 403
    assert TaskResults(dq, "django:").get("d1").status == "FAILED"  # type: ignore[union-attr]
    done = c.post("/failed/retry", data={"id": "d1", "csrf_token": token(c)},
                  follow_redirects=False)
    assert done.status_code == 303 and "one+more+attempt" in done.headers["location"]
    assert dq.with_kind("django:default:0").get("d1") is not None
    # An id with slashes (a periodic occurrence's) travels in the body.
    gone = c.post("/failed/discard", data={"id": "periodic/abc/1700000000000",
                                          "csrf_token": token(c)})
    assert gone.status_code == 200 and "discarded" in gone.text
    assert TaskResults(dq, "django:").get("periodic/abc/1700000000000") is None
    # The retrying list's discard cancels the row and drops its result.
    r1 = re.findall(r'data-id="(\d+)" data-key="r1"', retrying.text)[0]
    c.post("/failed/discard", data={"id": r1, "csrf_token": token(c), "back": "retrying"})
    assert TaskResults(dq, "django:").get("r1") is None


def test_the_api_and_the_outcome_page(dq: DelayedQueue) -> None:
    c = client(dq)
    listed = c.get("/api/failed", params={"limit": 1}).json()
    assert [f["ref"] for f in listed["failed"]] == ["periodic/abc/1700000000000"]
    rest = c.get("/api/failed", params={"cursor": listed["next_cursor"]}).json()
    assert [f["ref"] for f in rest["failed"]] == ["d2", "d1"] and rest["next_cursor"] is None
    outcome = c.get("/outcomes/periodic/abc/1700000000000")
    assert outcome.status_code == 200 and 'action="/failed/retry"' in outcome.text
    r = c.post("/api/failed/retry", json={"id": "d2"}, headers={"X-CSRF-Token": token(c)})
    assert r.status_code == 200 and r.json()["action"] == "retry"
    assert 'action="/failed/retry"' not in c.get("/outcomes/d2").text  # queued again
    missing = c.post("/api/failed/discard", json={"id": "nope"},
                     headers={"X-CSRF-Token": token(c)})
    assert missing.status_code == 404 and "no task" in missing.json()["error"]
    bad = c.post("/api/failed/explode", json={"id": "d1"}, headers={"X-CSRF-Token": token(c)})
    assert bad.status_code == 400


def test_read_only_and_celery_retries(dq: DelayedQueue) -> None:
    key = celery_retry(dq, "billing.remind", 3)
    ro = client(dq, read_only=True)
    page = ro.get("/failed", params={"state": "retrying"})
    assert key in page.text and 'action="/failed/retry"' not in page.text
    assert ro.post("/api/failed/retry", json={"id": key},
                   headers={"X-CSRF-Token": token(ro)}).status_code == 403
