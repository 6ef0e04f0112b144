"""Dead letters (every front end's), workers from leases, and Celery outcomes, through the
services and the web page's JSON API (Starlette's test client, real PostgreSQL, real Redis for
outcomes)."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator

import dramatiq  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import psycopg
import pytest
from _hangup import hang_up_server

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dramatiq.message import Message  # noqa: E402

from delayq_transport import DelayedQueue  # noqa: E402
from delayq_transport.browse import TaskNotFound  # noqa: E402
from delayq_transport.browse.deadletters import DeadLetterService  # noqa: E402
from delayq_transport.core.integrations import Bindings  # noqa: E402
from delayq_transport.core.queue import leases  # noqa: E402
from delayq_transport.dramatiq import DelayqBroker  # noqa: E402
from delayq_transport.web.app import create_app  # noqa: E402
from delayq_transport.web.security import WebConfig  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/14"  # shared with tests/browser/test_outcomes_pages.py


@pytest.fixture
def broker(database_url: str) -> Iterator[DelayqBroker]:
    b = DelayqBroker(url=database_url, dead_message_ttl=60_000)
    b.declare_queue("q")
    yield b
    b.close()


def fail(broker: DelayqBroker, *tags: str) -> None:
    """Send each tag, take it and nack it with a real exception, as a worker does."""
    for tag in tags:
        broker.enqueue(Message(queue_name="q", actor_name="act", args=(tag,), kwargs={},
                               options={"retries": 3, "traceback": "an earlier failure"}))
    consumer = broker.consume("q", prefetch=len(tags), timeout=2000)
    for _ in tags:
        proxy = next(consumer)
        assert proxy is not None
        try:
            raise ValueError(f"broken {proxy.args[0]}")
        except ValueError as exc:
            proxy.stuff_exception(exc)
        consumer.nack(proxy)
    consumer.close()


def api(queue: DelayedQueue, **options: object) -> TestClient:
    c = TestClient(create_app(queue, WebConfig(**options)),  # type: ignore[arg-type]
                   base_url="http://127.0.0.1:8377")
    c.headers["X-CSRF-Token"] = c.get("/api/csrf").json()["csrf_token"]
    return c


def test_dead_letters_list_show_requeue_and_delete(broker: DelayqBroker) -> None:
    fail(broker, "a", "b", "c")
    svc = DeadLetterService(broker.queue)
    assert svc.queues() == [{"queue": "q", "front_end": "dramatiq", "kind": "dramatiq:q.XQ",
                             "dead_letters": 3, "capped": False}]
    first = svc.list_page("q", limit=2)
    rest = svc.list_page(None, first.next_cursor, 2)
    ids = [d.row.id for d in first.items + rest.items]
    assert len(set(ids)) == 3 and rest.next_cursor is None
    shown = svc.find(ids[0]).as_dict(full=True)
    assert shown["exception"].startswith("ValueError: broken")  # the final failure, not the
    assert "raise ValueError" in shown["traceback"]  # earlier traceback Retries had written
    assert shown["retries"] == 3 and shown["actor"] == "act"

    c = api(broker.queue)
    listed = c.get("/api/dead-letters", params={"queue": "q"}).json()
    assert [d["id"] for d in listed["dead_letters"]] == ids
    assert c.get(f"/api/dead-letters/{ids[0]}").json()["traceback"] == shown["traceback"]
    assert c.post(f"/api/dead-letters/{ids[0]}/requeue").json()["queue"] == "q"
    assert c.post(f"/api/dead-letters/{ids[0]}/requeue").status_code == 404  # moved already
    assert c.delete(f"/api/dead-letters/{ids[1]}").json()["action"] == "delete"
    assert c.delete(f"/api/dead-letters/{ids[1]}").status_code == 404
    assert api(broker.queue, read_only=True).delete(
        f"/api/dead-letters/{ids[2]}").status_code == 403
    no_csrf = TestClient(create_app(broker.queue, WebConfig()), base_url="http://127.0.0.1:8377")
    assert no_csrf.post(f"/api/dead-letters/{ids[2]}/requeue").status_code == 403
    live = broker.queue.with_kind("celery")
    live.offer("live", b"{}")
    stored = live.get("live")
    assert stored is not None
    with pytest.raises(TaskNotFound):  # a live message is never a dead letter
        svc.find(stored.id)
    assert c.delete(f"/api/dead-letters/{stored.id}").status_code == 404

    # The requeued message runs again: due now, in its queue, its retry state gone.
    consumer = broker.consume("q", prefetch=1, timeout=5000)
    proxy = next(consumer)
    assert proxy is not None and proxy.args[0] in "abc"
    assert not {"retries", "traceback", "delayq_exception", "delayq_traceback"} & set(proxy.options)
    consumer.ack(proxy)
    consumer.close()
    assert svc.queues()[0]["dead_letters"] == 1
    page = c.get("/dead-letters?queue=q")
    assert page.status_code == 200 and "broken" in page.text
    assert "Traceback" in c.get(f"/dead-letters/{ids[2]}").text


def test_celery_and_django_dead_letters_are_listed_requeued_and_deleted_alike(
        broker: DelayqBroker, database_url: str) -> None:
    """A Celery message rejected without requeue (kombu, as a worker rejects) and a row a
    django.tasks worker could not read sit beside Dramatiq's on the same API; a Celery one goes
    back to its queue's bucket as it was, a django.tasks one can only be deleted."""
    import kombu

    from delayq_transport.core.queue import dead_letter
    from delayq_transport.formats.celery import kind_for
    from delayq_transport.formats.deadletters import DJANGO_KIND

    fail(broker, "a")
    with kombu.Connection("delayq+" + database_url) as conn:
        q = conn.SimpleQueue("mail")
        q.put({"n": 1}, headers={"task": "shop.mail", "id": "tid-1"}, priority=6)
        q.get(timeout=5).reject(requeue=False)
        q.close()
    with broker.queue.with_kind("django:default:0") as django:
        django.offer("junk", b"[1]")
        assert dead_letter(django, django.try_poll_many(1), DJANGO_KIND, 600) == 1
    c = api(broker.queue)
    listed = c.get("/api/dead-letters").json()
    assert sorted((q["front_end"], q["queue"]) for q in listed["queues"]) == [
        ("celery", "mail"), ("django.tasks", "django"), ("dramatiq", "q")]
    by_front = {d["front_end"]: d for d in listed["dead_letters"]}
    assert (by_front["celery"]["actor"], by_front["celery"]["message_id"]) == (
        "shop.mail", "tid-1")
    assert c.get("/api/dead-letters", params={"queue": "celery:mail"}).json()[
        "dead_letters"] == [by_front["celery"]]
    junk = by_front["django.tasks"]["id"]
    assert c.post(f"/api/dead-letters/{junk}/requeue").status_code == 400
    assert c.delete(f"/api/dead-letters/{junk}").json()["action"] == "delete"
    assert c.post(f"/api/dead-letters/{by_front['celery']['id']}/requeue").json()[
        "queue"] == "mail"
    back = broker.queue.with_kind(kind_for("mail", 6)).get("tid-1")
    assert back is not None and back.id == by_front["celery"]["id"]


def test_workers_are_read_from_leases_grouped_by_process_tag(database_url: str) -> None:
    with DelayedQueue(database_url, kind="celery") as q:
        for i in range(5):
            q.offer(f"k{i}", b"{}")
        first, second = q.try_poll_many(2), q.try_poll_many(2)
        assert first[0].lock[:8] == second[0].lock[:8] == leases.worker_tag()
        assert first[0].lock != second[0].lock and len(first[0].lock) == 36
        other = str(uuid.uuid4())  # a lock of another process (or an older delayq)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("""UPDATE delayed_queue SET "lockUuid" = %s,
                            "scheduledAt" = "scheduledAt" - 3600000
                            WHERE "lockUuid" IS NULL""", [other])
        Bindings(q.db, q.queries).bind("celery", "celery", "celery", "", "direct", False)
        Bindings(q.db, q.queries).bind("celery.pidbox", "", "w1@host.celery.pidbox", "",
                                       "fanout", True)
        found, capped, _ = leases.workers(q)
        assert [(w.tag, w.rows, len(w.leases), w.live) for w in found] == [
            (leases.worker_tag(), 4, 2, True), (other[:8], 1, 1, False)]
        assert not capped
        data = api(q).get("/api/workers").json()
        assert [w["rows"] for w in data["workers"]] == [4, 1]
        assert data["celery_workers"] == [{"name": "w1@host", "seen_at": data["celery_workers"][
            0]["seen_at"], "live": True}]
        assert [x["queue"] for x in data["queues"]] == ["celery"]
        assert leases.worker_tag() in api(q).get("/workers").text


@pytest.mark.xdist_group("redis-14")  # flushes it: not beside the browser tests that use it
def test_celery_outcomes_come_from_the_result_backend(database_url: str) -> None:
    import redis
    from celery import Celery

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    app = Celery("t", backend=REDIS_URL, set_as_current=False)
    try:
        app.backend.store_result("done-1", {"total": 3}, "SUCCESS")
        try:
            raise KeyError("nope")
        except KeyError as exc:
            app.backend.store_result("failed-1", exc, "FAILURE", traceback="Traceback: nope")
        with DelayedQueue(database_url, kind="celery") as q:
            c = api(q, result_backend=REDIS_URL)
            assert c.get("/api/outcomes/done-1").json()["result"] == {"total": 3}
            failed = c.get("/api/outcomes/failed-1").json()
            assert failed["state"] == "FAILURE" and "KeyError" in failed["result"]
            page = c.get("/tasks/failed-1", follow_redirects=True)  # gone from the queue
            assert "Traceback: nope" in page.text and "FAILURE" in page.text
            assert api(q, result_backend=REDIS_URL, hide_args=True).get(
                "/api/outcomes/done-1").json()["result"] == "(hidden)"
            assert api(q).get("/api/outcomes/done-1").status_code == 404  # none configured
            assert "--result-backend" in api(q).get("/outcomes/done-1").text
            down = api(q, result_backend="redis://127.0.0.1:1/0").get("/api/outcomes/x").json()
            assert down["error"]
            with hang_up_server() as (port, attempts):  # an error at once, not a retry loop
                hung = api(q, result_backend=f"redis://127.0.0.1:{port}/0").get(
                    "/api/outcomes/x").json()
            assert hung["error"] and 1 <= len(attempts) <= 2, (hung, attempts)
    finally:
        client.flushdb()
        app.close()


def test_dead_letters_from_the_command_line(broker: DelayqBroker, database_url: str) -> None:
    import json

    from click.testing import CliRunner

    from delayq_transport.cli import main

    fail(broker, "x", "y")
    run = CliRunner().invoke
    listed = json.loads(run(main, ["-d", database_url, "tasks", "dead-letters", "list",
                                   "--json"]).output)
    ids = [d["id"] for d in listed["dead_letters"]]
    assert len(ids) == 2 and listed["queues"][0]["dead_letters"] == 2
    shown = run(main, ["-d", database_url, "tasks", "dead-letters", "show", str(ids[0])])
    assert "ValueError: broken" in shown.output and "Traceback" in shown.output
    assert "requeued to q" in run(main, ["-d", database_url, "tasks", "dead-letters",
                                         "requeue", str(ids[0])]).output
    assert "deleted" in run(main, ["-d", database_url, "tasks", "dead-letters", "delete",
                                   str(ids[1])]).output
    gone = run(main, ["-d", database_url, "tasks", "dead-letters", "delete", str(ids[1])])
    assert gone.exit_code != 0 and "no dead letter" in gone.output
    assert "none" in run(main, ["-d", database_url, "tasks", "dead-letters", "list"]).output
