"""Pages touched per hot operation do not grow with the table (issue 10, part 1).

``test_plans_at_scale.py`` checks that each hot statement *plans* on its index; this checks
what the statements actually *touch*: shared buffers (hit + read) of one publish, poll, ack
and lease extension, run as delayq runs them, with 10k and then 30x more far-future rows in
the consumed kind. Far keys are md5 strings, spread like Celery's uuid task ids, so a publish
descends to a leaf among them rather than past the end of the key index.

What may grow: one more b-tree level per index descent (10k keys fit under a root of two
levels, 300k need three). A statement that walked the far-future rows, scanned the kind, or
fetched heap pages per far row would touch thousands more. The benchmark with real sizes and
a Celery worker is the ``scale`` scenario of ``bench/run.py`` (docs/benchmarks.md, "Millions of
waiting rows").
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import template_copy

from delayq_transport.core.db.queries import Queries

TABLE = "delayed_queue"
KIND = "celery"
SMALL, BIG = 10_000, 300_000
REPEAT = 5
LOAD = f"""
    INSERT INTO {TABLE} ("pKey", "pKind", payload, "scheduledAt", "scheduledAtInitially",
                         "createdAt")
    SELECT md5(i::text), %(kind)s, '\\x00', t + i, t + i, t
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i,
         (SELECT (extract(epoch FROM now()) * 1000)::bigint + 2592000000 AS t) AS n
"""
#: Index descents per operation that one more b-tree level may add to (a poll of 4 updates
#: 4 rows, each a new entry in each of the 4 indexes, plus its scan): the allowed growth.
DESCENTS = {"publish": 4, "poll": 4 * 4 + 2, "ack": 2, "extend_lease": 4 * 4 + 1,
            "short_poll": 2 * 4 + 2, "probe": 1}


def _blocks(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> int:
    """Shared buffers (hit + read) the statement's execution touched (planning left out)."""
    sql = query.replace(")b", ")s")  # binary-format markers: same values, text format
    row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def _round(conn: psycopg.Connection[Any], q: Queries) -> dict[str, int]:
    """One publish, poll (4 rows), lease extension and ack, each for real (autocommit)."""
    base = {"now": None, "kind": KIND, "payload": b"x" * 600, "scheduled_at": None,
            "announce": False, "pending": []}
    out = {"publish": _blocks(conn, q["offer_insert"], {**base, "key": str(uuid.uuid4())})}
    for _ in range(3):  # the poll below takes 4
        conn.execute(q["offer_insert"], {**base, "key": str(uuid.uuid4())})
    lock = str(uuid.uuid4())
    poll = {"now": None, "kinds": [KIND], "lows": [None], "limit": 4, "lock": lock,
            "lease_ms": 60_000, "want_next": True}
    out["poll"] = _blocks(conn, q["try_poll_many"], poll)
    ids = [r[0] for r in conn.execute(
        f'SELECT id FROM {TABLE} WHERE "lockUuid" = %s', [lock]).fetchall()]
    assert len(ids) == 4
    out["extend_lease"] = _blocks(conn, q["extend_lease"],
                                  {"now": None, "locks": [lock], "lease_ms": 60_000})
    out["ack"] = _blocks(conn, q["ack"], {"id": ids[0], "lock": lock})
    conn.execute(q["ack_lock"], {"lock": lock})
    # A short poll (fewer due rows than asked, the usual case at a steady load) and a probe
    # that finds nothing below its floor must stop at their upper bound, not at the kind's end.
    for _ in range(2):
        conn.execute(q["offer_insert"], {**base, "key": str(uuid.uuid4())})
    short = {**poll, "limit": 8, "lock": str(uuid.uuid4()), "want_next": False}
    out["short_poll"] = _blocks(conn, q["try_poll_many"], short)
    conn.execute(q["ack_lock"], {"lock": short["lock"]})
    floor = int(time.time() * 1000)
    out["probe"] = _blocks(conn, q["probe_below_watermark"],
                           {"now": None, "kinds": [KIND], "starts": [None], "floors": [floor]})
    return out


def _pages(conn: psycopg.Connection[Any], q: Queries) -> dict[str, int]:
    """Median over a few rounds: a page split or a pruned page can cost one round more."""
    rounds = [_round(conn, q) for _ in range(REPEAT)]
    return {op: int(statistics.median(r[op] for r in rounds)) for op in rounds[0]}


@pytest.fixture(scope="module")
def queue_db(template_db: str) -> Iterator[str]:
    with template_copy(template_db, prefix="delayq_pages") as url:
        yield url


@pytest.mark.slow
@pytest.mark.alone  # the pages an operation reads grew beside other tests on 2 busy cores (3 runs)
def test_pages_per_operation_do_not_grow_with_far_future_rows(queue_db: str) -> None:
    q = Queries(TABLE)
    with psycopg.connect(queue_db, autocommit=True) as conn:
        conn.execute("SET jit = off")
        conn.execute(LOAD, {"kind": KIND, "lo": 1, "hi": SMALL})
        conn.execute(f"VACUUM ANALYZE {TABLE}")  # same starting point for both sizes
        small = _pages(conn, q)
        conn.execute(LOAD, {"kind": KIND, "lo": SMALL + 1, "hi": BIG})
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        big = _pages(conn, q)
    for op, pages in big.items():
        assert pages <= small[op] + DESCENTS[op], (op, small, big)
