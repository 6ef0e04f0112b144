"""bench_web.py's search phase (issue 28): what an argument search costs at size, without and
with the opt-in trigram index, and what that index costs each publish.

* a needle planted in the row with the **latest ETA** (the worst case of a scan in ETA order)
  and a text that matches **nothing**: time to the first match / to the definitive "no match",
  following the cursor as the page does (slice after slice), capped at ``--search-cap`` seconds
  without the index (then the share of the ETA range searched is reported);
* the same with the index (and how long it took to build, and its size);
* publishes (``DelayedQueue.offer``, one Celery message each, distinct arguments) timed before
  and after the index exists, on the same table.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from delayq_transport import DelayedQueue
from delayq_transport.core.inspect import create_index
from delayq_transport.transport.message import encode, task_message

END_NEEDLE = "far-end-needle@example.org"
NO_MATCH = "matches-nothing-at-all"


def plant_end_needle(url: str, payload: bytes) -> None:
    """The row with the latest ETA gets a message naming ``END_NEEDLE``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""UPDATE delayed_queue SET "payload" = %s WHERE "id" = (
                            SELECT "id" FROM delayed_queue WHERE "pKind" = 'celery'
                            ORDER BY "scheduledAt" DESC LIMIT 1)""", (payload,))


def follow(client: httpx.Client, text: str, cap_s: float) -> dict[str, Any]:
    """Slices of ``GET /api/tasks?q=`` until a match, the end, or ``cap_s``."""
    start = time.perf_counter()
    cursor, requests, first_ms, scanned = None, 0, None, 0
    while True:
        params = {"q": text, "limit": 1, **({"cursor": cursor} if cursor else {})}
        t = time.perf_counter()
        data = client.get("/api/tasks", params=params).json()
        requests += 1
        first_ms = first_ms or (time.perf_counter() - t) * 1000
        scanned += data["scanned"]
        cursor = data["next_cursor"]
        elapsed = time.perf_counter() - start
        if data["tasks"] or cursor is None or elapsed > cap_s:
            return {"found": bool(data["tasks"]), "finished": bool(data["tasks"]) or
                    cursor is None, "total_ms": elapsed * 1000, "first_request_ms": first_ms,
                    "requests": requests, "rows_scanned": scanned,
                    "searched_to": data.get("searched_to"), "indexed": data.get("indexed")}


def publish_ms(url: str, n: int) -> float:
    """Median ms of one ``offer`` of a Celery message with distinct arguments."""
    rnd = random.Random(n)
    now = datetime.now(UTC)
    times = []
    with DelayedQueue(url, kind="celery") as queue:
        for _ in range(n):
            args = [{"user": rnd.randrange(10**9), "email": f"user{rnd.randrange(10**9)}@ex.com",
                     "note": json.dumps([rnd.random() for _ in range(5)])}]
            msg = task_message("app.remind", args, {}, eta=now + timedelta(days=1))
            t = time.perf_counter()
            queue.offer(msg["headers"]["id"], encode(msg), now + timedelta(hours=rnd.random()))
            times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def phase(url: str, base: str, cap_s: float, publishes: int, payload: bytes) -> dict[str, Any]:
    plant_end_needle(url, payload)
    out: dict[str, Any] = {"publish_ms_without_index": publish_ms(url, publishes)}
    with httpx.Client(base_url=base, timeout=120) as client:
        out["scan"] = {label: follow(client, text, cap_s)
                       for label, text in (("match at the end of the ETA range", END_NEEDLE),
                                           ("no match", NO_MATCH))}
        with psycopg.connect(url, autocommit=True) as conn:  # for the index build's sessions
            name = conn.execute("SELECT current_database()").fetchone()
            assert name is not None
            conn.execute(f'ALTER DATABASE "{name[0]}" SET maintenance_work_mem = \'1GB\'')
        with DelayedQueue(url, kind="celery") as queue:
            t = time.perf_counter()
            create_index(queue)
            out["index_build_s"] = time.perf_counter() - t
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT pg_size_pretty(pg_relation_size("
                               "'delayed_queue__search_trgm'))").fetchone()
            out["index_size"] = row[0] if row else None
        for _ in range(2):  # the first pass warms the index's pages
            out["indexed"] = {label: follow(client, text, 60.0) for label, text in (
                ("match at the end of the ETA range", END_NEEDLE), ("no match", NO_MATCH),
                ("a text in 10 rows (needle@example.com)", "needle@example.com"))}
    out["publish_ms_with_index"] = publish_ms(url, publishes)
    return out


def lines(data: dict[str, Any]) -> list[str]:
    """Markdown table rows: what each search took."""
    rows = []
    for mode in ("scan", "indexed"):
        for label, r in data.get(mode, {}).items():
            verdict = ("found" if r["found"] else "no match, definitive" if r["finished"]
                       else f"stopped, searched up to {r['searched_to']}")
            rows.append([("default scan" if mode == "scan" else "opt-in trigram index"), label,
                         f"{r['total_ms']:,.0f}", f"{r['first_request_ms']:,.0f}",
                         str(r["requests"]), f"{r['rows_scanned']:,}", verdict])
    return rows
