"""Client CPU of the hot statements on libpq itself vs through psycopg's cursor.

``core/db/direct.py`` runs the publish (``offer_insert``) and the poll (``try_poll_many``) with
``PGconn.exec_prepared``. This measures, on one connection of a fresh database, the client
CPU (``process_time``) of

* ``offer``: ``DelayedQueue.offer(durable=False)`` as shipped, against the same statement
  through a reused psycopg cursor (what ``offer`` ran before: ``cursor.execute(...).fetchone()``);
* ``poll``: ``DelayedQueue.poll(5)`` as shipped (watermark on, as the transport runs it),
  against ``try_poll_many`` through the cursor (``cursor.execute(...).fetchall()``), after
  offering 5 due rows each time; the rows are acked in one statement, outside the clock.

The cursor side times the statement alone, the shipped side the whole call (validation, pool,
watermark, envelopes included), so the saving shown is a lower bound. Rounds alternate; medians.
To compare whole calls across revisions, run it with ``PYTHONPATH`` pointing at each checkout
(``*_shipped_us`` is then that revision's ``offer``/``poll``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common, the harness

from _common import DEFAULT_ADMIN_URL, console, fresh_database  # noqa: E402

from delayq_transport import DelayedQueue  # noqa: E402
from delayq_transport.core.db.database import cursor_of  # noqa: E402

PAYLOAD = b"x" * 972  # a Celery no-op task message as the transport stores it


def _offers(q: DelayedQueue, n: int, shipped: bool) -> float:
    """µs of client CPU per publish."""
    keys = [str(uuid.uuid4()) for _ in range(n)]
    if shipped:
        start = time.process_time()
        for key in keys:
            q.offer(key, PAYLOAD, durable=False)
        return 1e6 * (time.process_time() - start) / n
    sql = q.queries["offer_insert"]
    with q.db.relaxed_pool.connection() as conn:
        cur = cursor_of(conn)
        start = time.process_time()
        for key in keys:
            cur.execute(sql, {"key": key, "kind": q.kind, "payload": PAYLOAD,
                              "scheduled_at": None, "now": None,
                              # no wake-up carried: the shipped side opens a window once
                              "announce": False, "pending": []}).fetchone()
        return 1e6 * (time.process_time() - start) / n


def _polls(q: DelayedQueue, n: int, shipped: bool) -> float:
    """µs of client CPU per poll of 5 due rows."""
    sql, spent = q.queries["try_poll_many"], 0.0
    for _ in range(n):
        for _ in range(5):
            q.offer(str(uuid.uuid4()), PAYLOAD, durable=False)
        if shipped:
            start = time.process_time()
            envelopes, _ = q.poll(5, [q.kind])
            spent += time.process_time() - start
            q.ack_many(envelopes)
            continue
        params: dict[str, Any] = {"kinds": [q.kind], "lows": [None], "want_next": False,
                                  "limit": 5, "lock": str(uuid.uuid4()),
                                  "lease_ms": q.lease_ms, "now": None}
        with q.db.relaxed_pool.connection() as conn:
            start = time.process_time()
            rows = cursor_of(conn).execute(sql, params).fetchall()
            spent += time.process_time() - start
        q.ack_many([(r[0], params["lock"]) for r in rows if r[0] is not None])
    return 1e6 * spent / n


@click.command()
@click.option("--offers", default=4000, show_default=True)
@click.option("--polls", default=1500, show_default=True)
@click.option("--rounds", default=3, show_default=True)
@click.option("--admin-url", default=DEFAULT_ADMIN_URL, show_default=True)
def main(offers: int, polls: int, rounds: int, admin_url: str) -> None:
    samples: dict[str, list[float]] = {}
    with fresh_database(admin_url, prefix="delayq_profile_direct") as url, \
            DelayedQueue(url, kind="celery", low_watermark=True, relaxed_consumer_commits=True,
                         pool_max_size=1) as q:
        _offers(q, 200, True), _offers(q, 200, False)  # connections, prepared statements, plans
        _polls(q, 50, True), _polls(q, 50, False)
        for _ in range(rounds):
            for shipped in (True, False):
                side = "shipped" if shipped else "cursor"
                samples.setdefault(f"offer_{side}_us", []).append(_offers(q, offers, shipped))
                samples.setdefault(f"poll5_{side}_us", []).append(_polls(q, polls, shipped))
            console.print({k: round(v[-1], 1) for k, v in samples.items()})
    medians = {k: round(statistics.median(v), 1) for k, v in samples.items()}
    print(json.dumps({"median_of": rounds, **medians,
                      "load_average": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
