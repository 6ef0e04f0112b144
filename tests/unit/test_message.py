"""The stored message format that beat, Spark and the transport share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayq_transport.core import InvalidInput
from delayq_transport.formats import celery as m


def test_encoder_matches_task_message():
    eta = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    enc = m.TaskMessageEncoder("app.remind", queue="q", priority=3, origin="o")
    fast = m.decode(enc.encode([1, "x", {"k": 2}], {"a": None}, task_id="tid", eta=eta,
                               delivery_tag="dt"))
    slow = m.task_message("app.remind", [1, "x", {"k": 2}], {"a": None}, task_id="tid", eta=eta,
                          queue="q", priority=3, origin="o")
    slow["properties"]["delivery_tag"] = "dt"
    assert fast == slow


def test_encoder_rejects_what_json_cannot_carry():
    enc = m.TaskMessageEncoder("app.t")
    with pytest.raises(InvalidInput, match="JSON"):
        enc.encode([object()], {}, task_id="t")
    with pytest.raises(InvalidInput, match="naive"):
        enc.encode([], {}, task_id="t", eta=datetime(2030, 1, 1))


@pytest.mark.parametrize(("priority", "kind"), [(None, "q"), (0, "q"), (2, "q"), (3, "q\x06\x163"),
                                                (8, "q\x06\x166"), (9, "q\x06\x169")])
def test_kinds_follow_redis_priority_buckets(priority, kind):
    assert m.kind_for("q", priority) == kind
    assert m.queue_of_kind(kind)[0] == "q"


def test_row_key_is_task_id_for_tasks_and_delivery_tag_otherwise():
    task = m.task_message("t", task_id="abc")
    assert m.row_key(task) == "abc"
    plain = {"headers": {}, "properties": {"delivery_tag": "dt"}}
    assert m.row_key(plain) == "dt"


def test_eta_naive_means_utc():
    msg = {"headers": {"eta": "2030-01-01T00:00:00"}}
    assert m.eta_of(msg) == datetime(2030, 1, 1, tzinfo=UTC)
    msg = {"headers": {"eta": (datetime(2030, 1, 1, tzinfo=UTC) + timedelta(hours=1)).isoformat()}}
    assert m.eta_of(msg) == datetime(2030, 1, 1, 1, tzinfo=UTC)
