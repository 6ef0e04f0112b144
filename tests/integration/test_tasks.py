"""`delayq tasks` service: listing with filters and keyset pages, show, cancel, reschedule,
run-now, the in-flight rule and the decoder registry, on real PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from delayq_transport import DelayedQueue
from delayq_transport.browse import (
    DecodedMessage,
    Decoder,
    TaskFilter,
    TaskInFlight,
    TaskNotFound,
    TaskService,
    decode,
    register_decoder,
)
from delayq_transport.cli import main
from delayq_transport.core import InvalidInput
from delayq_transport.formats import decoders as decoders_module
from delayq_transport.formats.celery import decode as decode_message
from delayq_transport.formats.celery import encode, kind_for, task_message

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


def publish(queue: DelayedQueue, task: str, args: list, at: datetime, *, qname: str = "celery",
            priority: int = 0, task_id: str | None = None, expires: datetime | None = None) -> str:
    msg = task_message(task, args, {}, eta=at, queue=qname, priority=priority, task_id=task_id,
                       expires=expires)
    key = msg["headers"]["id"]
    queue.with_kind(kind_for(qname, priority)).offer(key, encode(msg), at)
    return key


@pytest.fixture
def svc(database_url: str):
    with DelayedQueue(database_url, kind="celery") as q:
        yield TaskService(q)


def test_list_is_sorted_by_eta_and_pages_with_a_keyset_cursor(svc: TaskService) -> None:
    q = svc.queue
    keys = [publish(q, "app.remind", [i], T0 + timedelta(minutes=i % 7, seconds=i))
            for i in range(23)]
    seen: list[str] = []
    cursor = None
    while True:
        page = svc.list_page(TaskFilter(), cursor, limit=5)
        seen += [v.row.key for v in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    expected = sorted(keys, key=lambda k: svc.find(k).row.scheduled_at_ms)
    assert seen == expected and len(seen) == 23


def test_filters_queue_task_text_state_eta_and_priority_kinds(svc: TaskService) -> None:
    q = svc.queue
    a = publish(q, "billing.remind", [{"account": 42}], T0)
    publish(q, "billing.remind", [{"account": 7}], T0 + timedelta(hours=1))
    c = publish(q, "mail.send", ["x@example.com"], T0 + timedelta(hours=2), qname="mail",
                priority=6)
    due = publish(q, "mail.send", ["now"], datetime.now(UTC) - timedelta(minutes=1))

    def keys(**kw: str) -> list[str]:
        return [v.row.key for v in svc.list_page(TaskFilter.parse(**kw)).items]

    assert keys(text='"account": 42') == [a]
    assert keys(task="billing.*")[0] == a and len(keys(task="billing.*")) == 2
    assert keys(queue="mail") == [c]  # the priority-6 kind belongs to queue mail
    assert keys(state="due") == [due]
    assert due not in keys(state="scheduled") and len(keys(state="scheduled")) == 3
    assert keys(eta_after=(T0 + timedelta(minutes=30)).isoformat(),
                eta_before=(T0 + timedelta(hours=3)).isoformat())[1] == c


def test_show_decodes_the_celery_message(svc: TaskService) -> None:
    expires = T0 + timedelta(days=1)
    key = publish(svc.queue, "app.remind", [1, "two"], T0, priority=3, expires=expires)
    data = svc.find(key).as_dict(full=True)
    assert data["task"] == "app.remind" and data["priority"] == 3 and data["queue"] == "celery"
    assert data["message"]["args"] == [1, "two"] and data["message"]["kwargs"] == {}
    assert data["message"]["expires"] == expires.isoformat()
    assert data["state"] == "scheduled" and data["lease"] is None
    assert svc.find(str(data["id"])).row.key == key  # by row id too
    hidden = TaskService(svc.queue, hide_args=True).find(key).as_dict(full=True)
    assert hidden["message"]["args"] == "(hidden)" and "two" not in json.dumps(hidden)


def test_cancel_deletes_the_row_and_refuses_in_flight(svc: TaskService) -> None:
    q = svc.queue
    waiting = publish(q, "app.remind", [1], T0)
    running = publish(q, "app.remind", [2], datetime.now(UTC) - timedelta(seconds=1))
    held = q.try_poll()
    assert held is not None and held.key == running
    svc.cancel(waiting)
    assert q.get(waiting) is None
    with pytest.raises(TaskNotFound):
        svc.cancel(waiting)
    with pytest.raises(TaskInFlight, match="celery control revoke"):
        svc.cancel(running)
    with pytest.raises(TaskInFlight):
        svc.run_now(running)
    assert q.get(running) is not None and held.ack()


def test_reschedule_moves_row_and_message_eta_and_run_now(svc: TaskService) -> None:
    q = svc.queue
    key = publish(q, "app.remind", [1], T0)
    new = T0 + timedelta(hours=5)
    result = svc.reschedule(key, new)
    row = q.get(key)
    assert row is not None and row.scheduled_at == new
    assert decode_message(row.payload)["headers"]["eta"] == new.isoformat()
    assert result.eta == new.isoformat(timespec="milliseconds")
    before = q.now()
    svc.run_now(key)
    after = q.now()
    env = q.try_poll()  # due now, so it is delivered at once
    assert env is not None and env.key == key
    eta = datetime.fromisoformat(decode_message(env.payload)["headers"]["eta"])
    assert before <= eta <= after  # the database's now when it was moved
    env.ack()


def test_reschedule_after_expiry_warns(svc: TaskService) -> None:
    key = publish(svc.queue, "app.remind", [1], T0, expires=T0 + timedelta(minutes=5))
    assert "expires" in svc.reschedule(key, T0 + timedelta(hours=1)).detail


def test_bounded_scan_reports_partial_and_continues(svc: TaskService, monkeypatch) -> None:
    from delayq_transport.browse import service

    monkeypatch.setattr(service, "SCAN_LIMIT", 40)
    monkeypatch.setattr(service, "SCAN_CHUNK", 20)
    monkeypatch.setattr(service, "SCAN_TIME_BUDGET_S", 600.0)  # rows bound it here, not time
    q = svc.queue
    for i in range(100):
        publish(q, "app.noise", [i], T0 + timedelta(seconds=i))
    needle = publish(q, "app.needle", [0], T0 + timedelta(seconds=90, milliseconds=500))
    f = TaskFilter.parse(task="app.needle")
    page = svc.list_page(f)
    assert page.items == [] and page.partial and page.scanned == 40
    found = []
    while page.next_cursor is not None and not found:
        page = svc.list_page(f, page.next_cursor)
        found = [v.row.key for v in page.items]
    assert found == [needle]


def test_input_validation() -> None:
    with pytest.raises(InvalidInput):
        TaskFilter.parse(state="running'; DROP TABLE x")
    with pytest.raises(InvalidInput):
        TaskFilter.parse(eta_after="tomorrow")
    with pytest.raises(InvalidInput):
        TaskFilter.parse(text="x" * 500)
    from delayq_transport.browse import decode_cursor, parse_duration

    with pytest.raises(InvalidInput):
        decode_cursor("not-a-cursor!")
    assert parse_duration("15m") == timedelta(minutes=15)
    with pytest.raises(InvalidInput):
        parse_duration("-5s")


def test_decoder_registry_is_pluggable() -> None:
    def decode_dramatiq(payload: bytes) -> DecodedMessage | None:
        if not payload.startswith(b"DRQ:"):
            return None
        return DecodedMessage("dramatiq", task=payload[4:].decode(), args=[])

    before = decoders_module.decoders()
    try:
        register_decoder(Decoder("test-dramatiq", decode_dramatiq), first=True)
        assert decode(b"DRQ:actor").task == "actor"
        assert decode(encode(task_message("t", [1]))).format == "celery"
        assert decode(b"\x00garbage").format == "raw"
    finally:
        decoders_module._DECODERS[:] = before


def test_cli_list_show_cancel_reschedule(database_url: str) -> None:
    with DelayedQueue(database_url, kind="celery") as q:
        keys = [publish(q, "billing.remind", [{"account": i}], T0 + timedelta(minutes=i))
                for i in range(5)]
    runner = CliRunner()

    def run(*args: str, input: str | None = None):
        result = runner.invoke(main, ["-d", database_url, "tasks", *args], input=input)
        assert result.exit_code == 0, result.output
        return result.output

    listed = json.loads(run("list", "--json", "-n", "2"))
    assert [t["key"] for t in listed["tasks"]] == keys[:2] and listed["next_cursor"]
    more = json.loads(run("list", "--json", "--cursor", listed["next_cursor"]))
    assert [t["key"] for t in more["tasks"]] == keys[2:]
    assert json.loads(run("show", keys[0], "--json"))["message"]["args"] == [{"account": 0}]
    with DelayedQueue(database_url, kind="celery") as q:
        before = q.now()
        moved = json.loads(run("reschedule", keys[1], "--in", "2h", "--json"))
        after, row = q.now(), q.get(keys[1])
    assert moved["action"] == "reschedule" and row is not None
    # The row moved to 2 h from the database's now, and the message's ETA with it.
    assert before + timedelta(hours=2) <= row.scheduled_at <= after + timedelta(hours=2)
    assert datetime.fromisoformat(decode_message(row.payload)["headers"]["eta"]) == \
        row.scheduled_at
    assert moved["eta"] == row.scheduled_at.isoformat(timespec="milliseconds")
    soonest = json.loads(run("list", "--json", "-n", "1"))["tasks"]
    assert [t["key"] for t in soonest] == [keys[1]]  # 2 h from now comes before 2030
    out = run("cancel", "--search", '"account": 3', input="y\n")
    assert "cancel 1 matching task(s)?" in out and "cancelled 1" in out
    assert json.loads(run("cancel", "--task", "billing.*", "--yes", "--json"))["cancelled"] == 4
    bad = runner.invoke(main, ["-d", database_url, "tasks", "cancel", keys[0]])
    assert bad.exit_code == 1 and "no task" in bad.output
    bad = runner.invoke(main, ["-d", database_url, "tasks", "reschedule", keys[0]])
    assert bad.exit_code == 2 and "exactly one of --at or --in" in bad.output


def test_a_queue_name_selects_its_priority_kinds_of_every_front_end(database_url: str) -> None:
    """``-Q mail``: Celery's priority kinds of ``mail``, Dramatiq's and Django's task
    framework's, not their dead letters nor a queue whose name only starts alike;
    ``dramatiq:mail`` / ``django:mail`` one front end's; a kind by its name."""
    kinds = {"mail": True, "mail\x06\x166": True, "dramatiq:mail": True,
             "dramatiq:mail:p2": True, "django:mail:50": True, "django:mail:-3": True,
             "dramatiq:mail.XQ": False, "django.XQ": False, "celery": False,
             "mailbox": False, "dramatiq:mailbox": False, "django:mailbox:1": False,
             "django:default:0": False}
    with DelayedQueue(database_url, kind="celery") as q:
        for i, kind in enumerate(kinds):
            q.with_kind(kind).offer(f"k{i}", b'{"x": 1}', T0 + timedelta(seconds=i))
    runner = CliRunner()

    def listed(name: str) -> set[str]:
        result = runner.invoke(main, ["-d", database_url, "tasks", "list", "-Q", name,
                                      "--json"])
        assert result.exit_code == 0, result.output
        return {t["kind"] for t in json.loads(result.output)["tasks"]}

    assert listed("mail") == {k for k, ours in kinds.items() if ours}
    assert listed("dramatiq:mail") == {"dramatiq:mail", "dramatiq:mail:p2"}
    assert listed("django:mail") == {"django:mail:50", "django:mail:-3"}
    assert listed("django:mail:50") == {"django:mail:50"}
