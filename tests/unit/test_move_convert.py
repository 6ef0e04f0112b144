"""``delayq move-from``'s mapping from a source message to its row: the transport's own
(``formats.celery.row_of``), a stable identity per message, and refusals that say why."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from delayq_transport.cli import main
from delayq_transport.formats.celery import (
    decode,
    kind_for,
    parse_eta,
    protocol1_task,
    row_of,
    task_message,
)
from delayq_transport.move.convert import (
    ONCE_PREFIX,
    NotMovable,
    SourceMessage,
    from_amqp,
    from_kombu_json,
    to_offer,
)

STEPS = (0, 3, 6, 9)
ETA = datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)


def amqp_parts(message: dict) -> tuple[bytes, dict, dict]:
    """What basic_get returns for a message kombu published over AMQP."""
    props = dict(message["properties"])
    properties = {"content_type": message["content-type"],
                  "content_encoding": message["content-encoding"],
                  "application_headers": message["headers"], "priority": props["priority"],
                  "correlation_id": props["correlation_id"], "reply_to": props["reply_to"],
                  "delivery_mode": props["delivery_mode"]}
    info = {"exchange": "", "routing_key": "q", "delivery_tag": 7, "redelivered": True}
    return base64.b64decode(message["body"]), properties, info


def test_a_redis_message_moves_as_publishing_it_would_store_it() -> None:
    message = task_message("t.add", (1, 2), task_id="abc", eta=ETA, queue="q", priority=5)
    raw = json.dumps(message)
    offer = to_offer(from_kombu_json("q", raw), STEPS)
    row = row_of("q", message, STEPS)
    assert (offer.key, offer.kind, offer.payload, offer.scheduled_at) == tuple(row)
    assert (offer.key, offer.kind, offer.scheduled_at) == ("abc", kind_for("q", 3), ETA)
    # the identity is the publish's delivery tag and the queue: the same message read again
    # (even restored from unacked with kombu's redelivered flags) is the same message
    again = dict(message, headers=dict(message["headers"], redelivered=True))
    assert to_offer(from_kombu_json("q", json.dumps(again)), STEPS).once_id == offer.once_id
    assert to_offer(from_kombu_json("other", raw), STEPS).once_id != offer.once_id
    assert offer.once_id.startswith(ONCE_PREFIX)


def test_an_amqp_message_is_rebuilt_as_kombus_virtual_channel_would_build_it() -> None:
    message = task_message("t.add", (1,), task_id="abc", eta=ETA, queue="q", priority=9)
    offer = to_offer(from_amqp("q", *amqp_parts(message)), STEPS)
    stored = decode(offer.payload)
    assert (offer.key, offer.kind, offer.scheduled_at) == ("abc", kind_for("q", 9), ETA)
    assert stored["headers"] == message["headers"] and stored["body"] == message["body"]
    assert {k: stored["properties"][k] for k in ("correlation_id", "priority",
                                                 "delivery_mode", "body_encoding")} == {
        "correlation_id": "abc", "priority": 9, "delivery_mode": 2, "body_encoding": "base64"}
    assert stored["properties"]["delivery_info"] == {"exchange": "", "routing_key": "q"}
    # read again after an interruption (another delivery tag, redelivered): the very payload
    body, props, info = amqp_parts(message)
    again = to_offer(from_amqp("q", body, props, dict(info, delivery_tag=99)), STEPS)
    assert (again.once_id, again.payload) == (offer.once_id, offer.payload)


def test_protocol_1_keys_by_task_id_and_schedules_at_its_eta() -> None:
    body = {"task": "t.add", "id": "p1", "args": [1], "kwargs": {}, "retries": 2,
            "eta": ETA.replace(tzinfo=None).isoformat(), "utc": True}
    message = {"body": base64.b64encode(json.dumps(body).encode()).decode(),
               "content-type": "application/json", "content-encoding": "utf-8",
               "headers": {}, "properties": {"priority": 0, "body_encoding": "base64",
                                             "delivery_tag": "d1", "delivery_info": {}}}
    assert protocol1_task(message) == body
    offer = to_offer(SourceMessage("q", message, "x"), STEPS)
    assert (offer.key, offer.kind, offer.scheduled_at) == ("p1", "q", ETA)  # naive is UTC
    # the transport itself keys a non-task message by delivery tag and reads no body
    assert row_of("q", message, STEPS).key == "d1"


@pytest.mark.parametrize(("message", "reason"), [
    ({"body": "x"}, "not a kombu message (no properties)"),
    ({"properties": {}, "headers": ["task"]}, "not a kombu message (headers are not a "
                                               "mapping)"),
    ({"properties": {}, "headers": {"task": "t.add"}}, "Celery message of task 't.add' has "
                                                       "no task id"),
    ({"properties": {"body_encoding": "base64"}, "headers": {},
      "content-type": "application/x-python-serialize", "body": "gAJ9cQAu"},
     "not a Celery task message: no task header, and the body is not a protocol-1 task in "
     "JSON (content type 'application/x-python-serialize')"),
    ({"properties": {}, "headers": {"task": "t", "id": "i", "eta": "tomorrow"}},
     "message has an unparseable eta 'tomorrow'"),
])
def test_what_is_not_a_celery_task_is_refused_with_its_reason(message: dict,
                                                               reason: str) -> None:
    with pytest.raises(NotMovable) as info:
        to_offer(SourceMessage("q", message, "x" * 64), STEPS)
    assert str(info.value) == reason
    assert SourceMessage("q", message, "x" * 64).task_id() in ("<xxxxxxxxxxxx>", "i")


def test_unreadable_redis_items_are_refused() -> None:
    item = from_kombu_json("q", b"\xff not json")
    with pytest.raises(NotMovable, match="not JSON, so not a kombu message"):
        to_offer(item, STEPS)
    assert item.identity == from_kombu_json("q", b"\xff not json").identity


def test_eta_parsing_is_celerys() -> None:
    assert parse_eta(None) is None and parse_eta("") is None
    assert parse_eta(ETA.isoformat()) == ETA == parse_eta(ETA.replace(tzinfo=None).isoformat())
    later = (ETA + timedelta(hours=1)).astimezone()
    assert parse_eta(later.isoformat()) == ETA + timedelta(hours=1)


@pytest.mark.parametrize(("args", "says"), [
    (["move-from", "sqs://u:secret@host"], "unknown scheme 'sqs'"),
    (["move-from", "not a url"], "unknown scheme '(none)'"),
    (["move-from", "redis://h", "--priority-steps", "1,3"], "comma-separated buckets"),
])
def test_the_command_refuses_bad_input_before_touching_anything(args: list[str],
                                                                says: str) -> None:
    result = CliRunner().invoke(main, ["-d", "postgresql://nobody@127.0.0.1:1/none", *args])
    assert result.exit_code in (1, 2)
    out = " ".join(result.output.split())
    assert says in out and "secret" not in out
