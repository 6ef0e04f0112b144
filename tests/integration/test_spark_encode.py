"""Messages built in Spark's JVM (spark/encode.py) equal those of the Python encoder and of
Celery's own ``apply_async``: decoded, field by field, keys included."""

from __future__ import annotations

import base64
import json
import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pyspark  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import pytest
from _celery_apps import close_connections
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql import types as T  # noqa: E402

from delayq_transport import DelayedQueue  # noqa: E402
from delayq_transport.formats import celery as message  # noqa: E402
from delayq_transport.spark import schedule_tasks  # noqa: E402
from delayq_transport.spark import write as W  # noqa: E402
from delayq_transport.spark.encode import jvm_capable, jvm_ok  # noqa: E402
from delayq_transport.spark.rows import Plan, slow_record  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = ["plain", "it's", 'say "hi"', "both ' and \"", "back\\slash", "héllo wörld ✓", "emoji 🎉",
         "", None, "tab\there", "line\nbreak", "nbsp\u00a0x", "zero\u200bwidth"]


def _tuple(record: bytes) -> tuple[str, str, bytes, int]:
    """Decode one binary COPY tuple (key, kind, payload, at)."""
    fields, pos, out = struct.unpack_from(">h", record)[0], 2, []
    for _ in range(fields):
        (size,) = struct.unpack_from(">i", record, pos)
        out.append(record[pos + 4: pos + 4 + size])
        pos += 4 + size
    return out[0].decode(), out[1].decode(), out[2], struct.unpack(">q", out[3])[0]


def _decoded(payload: bytes) -> dict[str, Any]:
    msg = message.decode(payload)
    msg["body"] = json.loads(base64.b64decode(msg["body"]))
    return msg


def _plan(projected: Any, **over: Any) -> Plan:
    fields = {"database_url": "x", "table": "delayed_queue", "task": "app.t", "queue": "q",
              "priority": None, "kind": "q", "now_ms": 1_700_000_000_000, "countdown_ms": None,
              "has_key": False, "arg_count": 3, "kwarg_names": ("text", "n"),
              "ntz_fields": frozenset(), "past_eta": "run", "can_update": False,
              "chunk_size": 1000, "origin": "o", "sample_size": 5}
    return Plan(**{**fields, **over})


@pytest.mark.parametrize("keyed", [False, True])
def test_jvm_and_python_paths_build_the_same_messages(spark, keyed):
    base = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    rows = [(i, t, i % 3 == 0, -i * 10**12, base + timedelta(milliseconds=i * 1237))
            for i, t in enumerate(TEXTS)]
    schema = "i int, text string, flag boolean, big long, eta timestamp"
    df = spark.createDataFrame(rows, schema).withColumn("k", F.concat(F.lit("k/"), "i"))
    key = "k" if keyed else None
    projected = W._project(df, "eta", key, ["i", "flag", "big"], {"text": "text", "n": "i"})
    plan = _plan(projected, has_key=keyed)
    assert jvm_capable(projected, plan)
    collected = W._records(projected, plan).collect()
    jvm = {_tuple(r.record) for r in collected if r.record}
    assert 0 < len(jvm) < len(rows), "some rows take each path"
    # The others reach the writer as plain values, for the Python encoder.
    handed = {_tuple(slow_record(plan, tuple(r.row))[0] or b"") for r in collected if r.row}
    assert len(jvm) + len(handed) == len(rows)
    assert projected.where(jvm_ok(projected, plan)).count() == len(jvm)
    python = set()
    for row in projected.collect():
        record, reason, _ = slow_record(plan, row)
        assert reason is None and record is not None
        python.add(_tuple(record))
    assert handed <= python and len(python) == len(rows)
    by_key = {t[0]: t for t in python}
    for key_, kind, payload, at in jvm:
        expected = by_key[key_]
        assert (kind, at) == (expected[1], expected[3])
        assert _decoded(payload) == _decoded(expected[2]), key_


def test_countdown_and_non_jvm_types_take_the_python_path(spark):
    df = spark.createDataFrame([(1, 2.5), (2, None)], "i int, x double")
    projected = W._project(df, None, None, ["i", "x"], {})
    plan = _plan(projected, countdown_ms=60_000, arg_count=2, kwarg_names=())
    assert not jvm_capable(projected, plan)
    counted = W._project(df, None, None, ["i"], {})
    plan = _plan(counted, countdown_ms=60_000, arg_count=1, kwarg_names=())
    jvm = {_tuple(r.record) for r in W._records(counted, plan).collect()}
    python = {_tuple(slow_record(plan, row)[0] or b"") for row in counted.collect()}
    assert {(k, a) for k, _, _, a in jvm} == {(k, a) for k, _, _, a in python}


def test_messages_match_apply_async(spark, database_url):
    """A row scheduled by Spark and the same task sent by Celery's apply_async decode alike."""
    from celery import Celery

    import delayq_transport.transport  # noqa: F401  (registers delayq+postgresql://)

    eta = datetime.now(UTC).replace(microsecond=123000) + timedelta(days=1)
    df = spark.createDataFrame([(7, "it's \"x\" ✓", True, "spark-7", eta)],
                               T.StructType([T.StructField("n", T.LongType()),
                                             T.StructField("text", T.StringType()),
                                             T.StructField("flag", T.BooleanType()),
                                             T.StructField("key", T.StringType()),
                                             T.StructField("eta", T.TimestampType())]))
    result = schedule_tasks(df, "app.compare", "eta", args=["n", "text"], kwargs={"flag": "flag"},
                            key="key", queue="cmp", database_url=database_url)
    assert result.created == 1
    app = Celery("cmp", broker="delayq+" + database_url, set_as_current=False)
    app.conf.update(enable_utc=True, timezone="UTC")

    @app.task(name="app.compare")
    def compare(n: int, text: str, flag: bool) -> None:  # only published here
        return None

    try:
        compare.apply_async((7, "it's \"x\" ✓"), {"flag": True}, task_id="celery-7", eta=eta,
                            queue="cmp")
    finally:
        close_connections(app)
        app.close()
    with DelayedQueue(database_url, kind="cmp") as q:
        ours, theirs = q.get("spark-7"), q.get("celery-7")
    assert ours is not None and theirs is not None
    assert ours.scheduled_at == theirs.scheduled_at == eta
    a, b = _decoded(ours.payload), _decoded(theirs.payload)
    assert a["body"] == b["body"]  # args, kwargs, embed
    ignore = {"id", "root_id", "origin"}
    assert {k: v for k, v in a["headers"].items() if k not in ignore} == \
        {k: v for k, v in b["headers"].items() if k not in ignore}
    assert a["headers"]["id"] == "spark-7"
    assert a["properties"]["delivery_info"] == b["properties"]["delivery_info"]
    assert {k: a[k] for k in ("content-type", "content-encoding")} == \
        {k: b[k] for k in ("content-type", "content-encoding")}
