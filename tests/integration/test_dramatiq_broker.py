"""The Dramatiq broker in-process: due-only delivery, dead letters, retention, decoding."""

from __future__ import annotations

import time
from collections.abc import Iterator

import dramatiq  # noqa: E402
import pytest
from dramatiq.message import Message  # noqa: E402

from delayq_transport.core.queue import dead_letters  # noqa: E402
from delayq_transport.dramatiq import DelayqBroker, decode_dramatiq  # noqa: E402
from delayq_transport.formats.dramatiq import queue_of_kind  # noqa: E402


@pytest.fixture
def broker(database_url: str) -> Iterator[DelayqBroker]:
    b = DelayqBroker(url=database_url, dead_message_ttl=60_000)
    dramatiq.set_broker(b)
    b.declare_queue("q")
    yield b
    b.close()


def _message(*args: object) -> Message:
    return Message(queue_name="q", actor_name="a", args=args, kwargs={}, options={})


def test_a_delayed_message_is_a_row_due_at_its_eta_and_is_never_delivered_early(
        broker: DelayqBroker) -> None:
    # 400 ms was the whole budget for the row read, the consumer's start (hub thread, LISTEN
    # connection) and a 100 ms wait: a busy box spent it, and the due message came back.
    sent = broker.enqueue(_message(1), delay=2000)
    assert sent.queue_name == "q.DQ" and "eta" in sent.options
    row = dead_letters.list_kinds(broker.queue, ["dramatiq:q"])[0]
    assert row.scheduled_at_ms == sent.options["eta"]
    consumer = broker.consume("q", prefetch=4, timeout=100)
    assert next(consumer) is None  # not due: nothing reaches the worker
    deadline = time.monotonic() + 10
    proxy = None
    while proxy is None and time.monotonic() < deadline:
        proxy = next(consumer)
    assert proxy is not None and time.time() * 1000 >= sent.options["eta"]
    # It arrives as the due message Dramatiq would run: its queue, no eta.
    assert proxy.queue_name == "q" and "eta" not in proxy.options
    consumer.ack(proxy)
    consumer.close()
    assert broker.stats("q") == {"messages": 0, "dead_letters": 0}


def test_nack_moves_the_row_to_dead_letters_which_expire_after_their_retention(
        broker: DelayqBroker) -> None:
    broker.enqueue(_message("bad"))
    consumer = broker.consume("q", prefetch=1, timeout=2000)
    proxy = next(consumer)
    assert proxy is not None
    proxy.options["traceback"] = "boom"
    consumer.nack(proxy)
    consumer.close()
    dead = broker.dead_letters_of("q")
    assert [m.args for m in dead] == [("bad",)] and dead[0].options["traceback"] == "boom"
    assert broker.stats("q") == {"messages": 0, "dead_letters": 1}
    assert broker.expire_dead_letters() == 0  # kept for dead_message_ttl
    short = DelayqBroker(url=broker.db.url, dead_message_ttl=0)
    short.declare_queue("q")
    try:
        assert short.expire_dead_letters() == 0  # retention is fixed when dead-lettered
        # A dead letter whose retention has ended is deleted, and only it: the one still kept,
        # and a live message waiting in the queue, stay. Dead-lettered as a nack does it, with
        # the broker's retention, but without a consumer: its hub would expire it at any time.
        short.enqueue(_message("expired"))
        short.enqueue(_message("waiting"), delay=3_600_000)
        env = short.queue.with_kind("dramatiq:q").try_poll()
        assert env is not None
        assert dead_letters.dead_letter(short.queue, [env], short.dead_letter_kind("q"),
                                      short.dead_message_ttl_s) == 1
        assert short.stats("q") == {"messages": 1, "dead_letters": 2}
        assert short.expire_dead_letters() == 1
        assert [m.args for m in short.dead_letters_of("q")] == [("bad",)]
        assert short.stats("q") == {"messages": 1, "dead_letters": 1}
        assert short.expire_dead_letters() == 0
    finally:
        short.close()


def test_dead_letter_and_ack_only_touch_rows_still_held_under_their_lock(
        broker: DelayqBroker) -> None:
    broker.enqueue(_message(1))
    env = broker.queue.with_kind("dramatiq:q").try_poll()
    assert env is not None
    moved = dead_letters.dead_letter(broker.queue, [(env.id, "not-the-lock")], "dramatiq:q.XQ", 60)
    assert moved == 0
    assert dead_letters.dead_letter(broker.queue, [env], "dramatiq:q.XQ", 0) == 1
    assert dead_letters.expire(broker.queue, ["dramatiq:q.XQ"]) == 1


def test_join_waits_for_in_flight_rows_and_times_out(broker: DelayqBroker) -> None:
    from dramatiq.errors import QueueJoinTimeout

    broker.enqueue(_message(1))
    consumer = broker.consume("q", prefetch=1, timeout=2000)
    proxy = next(consumer)
    with pytest.raises(QueueJoinTimeout):
        broker.join("q", timeout=100)  # held, not acked yet
    consumer.ack(proxy)
    broker.join("q", timeout=5000)
    consumer.close()


def test_decoder_and_kind_names() -> None:
    payload = _message(1, 2).encode()
    decoded = decode_dramatiq(payload)
    assert decoded is not None and decoded["name"] == "a" and decoded["args"] == [1, 2]
    assert decode_dramatiq(b'{"task": "celery"}') is None
    assert decode_dramatiq(b"\x00not json") is None
    assert queue_of_kind("dramatiq:q:p3") == ("q", 3, False)
    assert queue_of_kind("dramatiq:q.XQ") == ("q", 0, True)
    assert queue_of_kind("celery") is None


def test_periodic_entries_live_in_their_own_ledger_next_to_celery_beat(
        broker: DelayqBroker) -> None:
    from datetime import UTC

    from delayq_beat.installer import Installer
    from delayq_beat.store import BeatStore
    from delayq_transport.dramatiq.ledger import DramatiqLedger
    from delayq_transport.dramatiq.periodic import PeriodicScheduler, periodic

    @periodic(cron="30 7 * * *", tz="Europe/Paris", name="dramatiq:t-report")
    @dramatiq.actor(queue_name="q")
    def report() -> None:
        pass

    scheduler = PeriodicScheduler(broker, entries={"dramatiq:t-report": _registry_entry()})
    report_ = scheduler.refresh()
    assert report_.installed["dramatiq:t-report"] >= 3 and not report_.errors
    times = [m.scheduled_at for m in
             dead_letters.list_kinds(broker.queue, ["dramatiq:q"])]
    assert times and all((t.hour, t.minute) in ((6, 30), (5, 30)) for t in times)  # 07:30 Paris
    # A Celery beat on the same table, with no entries, uninstalls nothing of Dramatiq's.
    celery_store = BeatStore(broker.db, broker.table)
    Installer(broker.queue, celery_store, UTC).refresh({})
    assert celery_store.installed() == []
    ledger = DramatiqLedger(broker.db, broker.table)
    assert [i.name for i in ledger.installed()] == ["dramatiq:t-report"]
    assert dead_letters.count_all(broker.queue, ["dramatiq:q"]) == len(times)
    # Removing the entry uninstalls its occurrences at the next refresh of a scheduler
    # restarted without it (the old one stopped: a configuration alive stays in force).
    scheduler.stop()
    PeriodicScheduler(broker, entries={}).refresh()
    assert dead_letters.count_all(broker.queue, ["dramatiq:q"]) == 0


def _registry_entry():  # type: ignore[no-untyped-def]
    from delayq_transport.dramatiq.periodic import REGISTRY

    return REGISTRY["dramatiq:t-report"]


def test_delayq_tasks_lists_shows_and_reschedules_dramatiq_rows(broker: DelayqBroker) -> None:
    """The `delayq tasks` service (and so the web page) decodes Dramatiq rows with the decoder
    the Dramatiq package provides; rescheduling moves the row and the message's eta."""
    from datetime import UTC, datetime, timedelta

    from delayq_transport.browse import TaskFilter, TaskService

    sent = broker.enqueue(Message(queue_name="q", actor_name="remind", args=(42,),
                                  kwargs={"who": "ann"}, options={}), delay=3_600_000)
    svc = TaskService(broker.queue)
    [view] = svc.list_page(TaskFilter(task="remind")).items
    assert view.message is not None and view.message.format == "dramatiq"
    assert (view.message.task, view.message.task_id) == ("remind", sent.message_id)
    assert (view.message.args, view.message.kwargs) == ([42], {"who": "ann"})
    assert view.eta_ms == sent.options["eta"]
    at = datetime.now(UTC) + timedelta(days=2)
    svc.reschedule(view.row.id, at)
    [moved] = svc.list_page(TaskFilter(task="remind")).items
    assert moved.eta_ms == int(at.timestamp() * 1000)
    [row] = dead_letters.list_kinds(broker.queue, ["dramatiq:q"])
    stored = decode_dramatiq(bytes(row.payload))
    assert stored is not None and stored["eta_ms"] == int(at.timestamp() * 1000)
