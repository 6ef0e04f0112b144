"""`delayq web` over HTTP (Starlette's test client, real PostgreSQL): the JSON API, and each
security option: loopback default, credentials, CSRF, read-only, hidden arguments, validation."""

from __future__ import annotations

import base64
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

with warnings.catch_warnings():  # starlette 1.x nudges toward httpx2; httpx works the same
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from delayq_transport import DelayedQueue
from delayq_transport.cli import main
from delayq_transport.formats.celery import encode, task_message
from delayq_transport.web.app import create_app
from delayq_transport.web.security import ConfigError, WebConfig

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
SECRET_ARG = "alice@example.com"


@pytest.fixture
def dq(database_url: str) -> Iterator[DelayedQueue]:
    with DelayedQueue(database_url, kind="celery") as q:
        for i in range(3):
            msg = task_message("billing.remind", [SECRET_ARG, i], {}, eta=T0, task_id=f"t{i}")
            q.offer(f"t{i}", encode(msg), T0 + timedelta(minutes=i))
        yield q


def client(dq: DelayedQueue, **options: object) -> TestClient:
    config = WebConfig(**options)  # type: ignore[arg-type]
    return TestClient(create_app(dq, config), base_url="http://127.0.0.1:8377")


def csrf(c: TestClient) -> dict[str, str]:
    return {"X-CSRF-Token": c.get("/api/csrf").json()["csrf_token"]}


def test_api_reads_and_changes(dq: DelayedQueue) -> None:
    c = client(dq)
    tasks = c.get("/api/tasks", params={"limit": 2}).json()
    assert [t["key"] for t in tasks["tasks"]] == ["t0", "t1"] and tasks["next_cursor"]
    rest = c.get("/api/tasks", params={"cursor": tasks["next_cursor"]}).json()
    assert [t["key"] for t in rest["tasks"]] == ["t2"] and rest["next_cursor"] is None
    assert c.get("/api/tasks/t1").json()["message"]["args"] == [SECRET_ARG, 1]
    overview = c.get("/api/overview").json()
    assert overview["queues"][0]["queue"] == "celery" and overview["queues"][0]["scheduled"] == 3
    assert len(c.get("/api/timeline", params={"hours": 6, "buckets": 12}).json()["counts"]) == 12
    at = (T0 + timedelta(hours=2)).isoformat()
    r = c.post("/api/tasks/t1/reschedule", json={"at": at}, headers=csrf(c))
    assert r.status_code == 200 and dq.get("t1").scheduled_at == T0 + timedelta(hours=2)
    assert c.delete("/api/tasks/t0", headers=csrf(c)).status_code == 200
    assert dq.get("t0") is None
    assert c.get("/api/tasks/t0").status_code == 404
    for page in ("/", "/tasks", "/tasks/t1", "/beat", "/tasks?q=alice"):
        assert c.get(page).status_code == 200, page


def test_in_flight_task_is_refused_with_409(dq: DelayedQueue) -> None:
    dq.offer("now", encode(task_message("x", [])), datetime.now(UTC) - timedelta(seconds=1))
    held = dq.try_poll()
    assert held is not None and held.key == "now"
    c = client(dq)
    r = c.post("/api/tasks/now/cancel", headers=csrf(c))
    assert r.status_code == 409 and "in flight" in r.json()["error"]
    assert dq.get("now") is not None
    page = c.get("/tasks/now").text
    assert "cannot be cancelled or moved" in page and 'id="cancel"' not in page


def test_state_changes_need_csrf_and_post(dq: DelayedQueue) -> None:
    c = client(dq)
    assert c.post("/api/tasks/t0/cancel").status_code == 403
    assert c.post("/api/tasks/t0/cancel", headers={"X-CSRF-Token": "wrong"}).status_code == 403
    assert c.post("/tasks/t0/cancel", data={"csrf_token": "wrong"}).status_code == 403
    cross = dict(csrf(c), Origin="http://evil.example")
    assert c.post("/api/tasks/t0/cancel", headers=cross).status_code == 403
    assert c.get("/tasks/t0/cancel").status_code == 405  # never a GET
    assert dq.get("t0") is not None
    token = c.get("/api/csrf").json()["csrf_token"]
    r = c.post("/tasks/t0/cancel", data={"csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303 and dq.get("t0") is None


def test_read_only_mode(dq: DelayedQueue) -> None:
    c = client(dq, read_only=True)
    for path in ("/api/tasks/t0/cancel", "/api/tasks/t0/run-now", "/tasks/t0/cancel",
                 "/api/beat/disable"):
        assert c.post(path, headers=csrf(c)).status_code == 403, path
    assert c.delete("/api/tasks/t0", headers=csrf(c)).status_code == 403
    assert dq.get("t0") is not None
    page = c.get("/tasks/t0").text
    assert "read-only" in page and 'id="cancel"' not in page and 'id="run-now"' not in page


def test_hide_args(dq: DelayedQueue) -> None:
    c = client(dq, hide_args=True)
    for path in ("/api/tasks", "/api/tasks/t0", "/tasks", "/tasks/t0"):
        body = c.get(path).text
        assert SECRET_ARG not in body, path
    assert c.get("/api/tasks", params={"q": "alice"}).status_code == 400  # no probing


def test_credentials(dq: DelayedQueue) -> None:
    c = client(dq, token="s3cret-token", basic_auth="admin:pa55word")
    assert c.get("/").status_code == 401
    assert c.get("/", headers={"WWW-Authenticate": "x"}).headers["www-authenticate"].startswith(
        "Basic")
    assert c.get("/api/tasks", headers={"Authorization": "Bearer wrong-token"}).status_code == 401
    ok = {"Authorization": "Bearer s3cret-token"}
    assert c.get("/api/tasks", headers=ok).status_code == 200
    basic = base64.b64encode(b"admin:pa55word").decode()
    assert c.get("/", headers={"Authorization": f"Basic {basic}"}).status_code == 200
    bad = base64.b64encode(b"admin:nope").decode()
    assert c.get("/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
    # A Bearer token cannot be sent by a forged cross-site form: no CSRF token needed.
    assert c.post("/api/tasks/t0/cancel", headers=ok).status_code == 200


def test_bind_rules_and_host_header(dq: DelayedQueue) -> None:
    with pytest.raises(ConfigError, match="without credentials"):
        WebConfig(host="0.0.0.0").validate()
    with pytest.raises(ConfigError):
        WebConfig(host="0.0.0.0", token="short").validate()
    WebConfig(host="0.0.0.0", token="long-enough-token").validate()
    result = CliRunner().invoke(main, ["-d", dq.db.url, "web", "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "without credentials" in result.output
    rebinding = TestClient(create_app(dq, WebConfig()), base_url="http://evil.example")
    assert rebinding.get("/api/csrf").status_code == 400  # DNS rebinding: wrong Host


def test_input_validation(dq: DelayedQueue) -> None:
    c = client(dq)
    for params in ({"state": "bogus"}, {"eta_after": "soon"}, {"limit": "100000"},
                   {"limit": "x"}, {"cursor": "%%%"}, {"q": "x" * 300}):
        r = c.get("/api/tasks", params=params)
        assert r.status_code == 400 and r.json()["error"], params
    assert c.get("/tasks", params={"state": "bogus"}).status_code == 400
    assert c.get("/api/timeline", params={"hours": "-1"}).status_code == 400
    assert c.post("/api/tasks/t0/reschedule", json={"in": "soon"},
                  headers=csrf(c)).status_code == 400
    assert c.post("/api/tasks/t0/reschedule", content=b"[1]", headers={
        **csrf(c), "content-type": "application/json"}).status_code == 400
    assert c.get("/api/tasks/' OR 1=1 --").status_code == 404


def test_beat_entries_enable_disable_and_filter(dq: DelayedQueue) -> None:
    from datetime import timedelta as td

    from delayq_beat.entries import key_prefix
    from delayq_beat.store import BeatStore

    store = BeatStore(dq.db, "delayed_queue")
    store.add("nightly/report", "reports.build", td(hours=24), ["all"])
    tick = task_message("reports.build", ["all"], {}, eta=T0 + timedelta(days=1))
    dq.offer(f"{key_prefix('nightly/report')}/abc123/1", encode(tick), T0 + timedelta(days=1))
    c = client(dq)
    entries = c.get("/api/beat").json()["entries"]
    assert [(e["name"], e["enabled"], e["task"]) for e in entries] == [
        ("nightly/report", True, "reports.build")]
    assert "every 86400.0s" in c.get("/beat").text
    r = c.post("/api/beat/disable", json={"name": "nightly/report"}, headers=csrf(c))
    assert r.status_code == 200 and not store.entries()[0].enabled
    assert c.post("/api/beat/enable", json={"name": "nope"}, headers=csrf(c)).status_code == 400
    assert c.post("/api/beat/explode", json={"name": "x"}, headers=csrf(c)).status_code == 400
    listed = c.get("/api/tasks", params={"beat": "nightly/report"}).json()["tasks"]
    assert [t["task"] for t in listed] == ["reports.build"]  # only the entry's occurrences
