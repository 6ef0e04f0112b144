"""bench_churn.py's load: a steady queue load at the core level, sampled over time (also run
for 30 s by ``tests/integration/test_churn_short.py``).

One producer thread offers ``rate`` rows a second (due now, batched every 20 ms), consumer
threads poll up to ``batch`` rows and ack them, as the transport does (relaxed commits, the
watermark on or off). Every ``sample_s`` a sampler records the window's executed rate,
pick-up latency (ack time minus the row's due time) p50/p99, the poll statement's p99, and
the table's size, index size and dead tuples. ``far_rows`` far-future rows of the same kind
sit in the table the whole time; a REPEATABLE READ snapshot can be held from ``snapshot_at_s``
on (what ``pg_dump`` does).

``variant`` picks the consumer: ``watermark`` (delayq's poll), ``no_watermark`` (the poll
from the bottom of the index, without the low watermark) or ``hot_acquire``
(:class:`HotAcquireQueue`: the alternative design of an acquire that writes no indexed
column, kept as the reference the watermark is compared with under a held snapshot).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from _common import (
    FAR_FUTURE_MS,
    TABLE,
    hold_snapshot,
    load_far_rows,
    median_of,
    percentile,
    table_stats,
    vacuum_analyze,
)

from delayq_transport import Database, DelayedQueue

VARIANTS = ("watermark", "no_watermark", "hot_acquire")
PRODUCE_TICK_S = 0.02
IDLE_SLEEP_S = 0.005


@dataclass
class SteadyConfig:
    url: str
    seconds: float
    rate: float
    far_rows: int = 0
    consumers: int = 2
    batch: int = 100
    sample_s: float = 10.0
    variant: str = "watermark"
    snapshot_at_s: float | None = None
    kind: str = "steady"
    payload: bytes = b"x" * 200


@dataclass
class Window:
    """What the consumers did between two samples."""

    pickups_ms: list[float] = field(default_factory=list)
    polls_ms: list[float] = field(default_factory=list)
    done: int = 0


def prepare(cfg: SteadyConfig) -> float:
    """Schema and far-future rows for ``cfg`` on a fresh database; returns the load seconds."""
    with Database(cfg.url, max_size=1) as db:
        if cfg.variant == "hot_acquire":
            HotAcquireQueue(db, cfg.kind)
        else:
            DelayedQueue(db, kind=cfg.kind)
    start = time.monotonic()
    if cfg.far_rows and cfg.variant == "hot_acquire":
        load_far_rows_hot(cfg.url, cfg.kind, cfg.far_rows)
    elif cfg.far_rows:
        load_far_rows(cfg.url, cfg.kind, cfg.far_rows)
    vacuum_analyze(cfg.url, HotAcquireQueue.TABLE if cfg.variant == "hot_acquire" else TABLE)
    return time.monotonic() - start


def _p(values: list[float], q: int) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value, 2)


class SteadyRun:
    """Threads of one run; :meth:`run` returns its samples."""

    def __init__(self, cfg: SteadyConfig) -> None:
        self.cfg = cfg
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.window = Window()
        self.errors: list[BaseException] = []
        #: Rows offered, rows handed to a consumer, and acks that deleted their row, over the
        #: whole run: a row delivered twice shows as delivered > acked.
        self.produced = self.delivered = self.acked = 0
        self.db = Database(cfg.url, max_size=cfg.consumers + 2)
        self.table = HotAcquireQueue.TABLE if cfg.variant == "hot_acquire" else TABLE
        if cfg.variant == "hot_acquire":
            self.queue: Any = HotAcquireQueue(self.db, cfg.kind)
        else:
            self.queue = DelayedQueue(self.db, kind=cfg.kind, relaxed_consumer_commits=True,
                                      low_watermark=cfg.variant == "watermark",
                                      full_rescan_interval=30.0)

    def _guard(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # noqa: BLE001 - reported by run()
                self.errors.append(exc)
                self.stop.set()
        return run

    def _produce(self) -> None:
        per_tick = self.cfg.rate * PRODUCE_TICK_S
        owed, start, tick = 0.0, time.monotonic(), 0
        while not self.stop.is_set():
            owed += per_tick
            n, owed = int(owed), owed - int(owed)
            if n:
                self.queue.offer_batch([(uuid.uuid4().hex, self.cfg.payload, None)
                                        for _ in range(n)], can_update=False)
                with self.lock:
                    self.produced += n
            tick += 1
            pause = start + tick * PRODUCE_TICK_S - time.monotonic()
            if pause > 0:
                self.stop.wait(pause)

    def _consume(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            got = self.queue.poll(self.cfg.batch)[0]
            poll_ms = (time.perf_counter() - t0) * 1000
            acked = self.queue.ack_many(got) if got else 0
            now_ms = time.time() * 1000
            with self.lock:
                self.delivered += len(got)
                self.acked += acked
                self.window.polls_ms.append(poll_ms)
                self.window.pickups_ms += [now_ms - e.scheduled_at_initially_ms for e in got]
                self.window.done += len(got)
            if not got:
                self.stop.wait(IDLE_SLEEP_S)

    def _sample(self, t: float, seconds: float) -> dict[str, Any]:
        with self.lock:
            window, self.window = self.window, Window()
        return {"t_s": round(t, 1), "rate_per_s": round(window.done / seconds, 1),
                "pickup_p50_ms": _p(window.pickups_ms, 50),
                "pickup_p99_ms": _p(window.pickups_ms, 99),
                "poll_p50_ms": _p(window.polls_ms, 50), "poll_p99_ms": _p(window.polls_ms, 99),
                "polls": len(window.polls_ms), "delivered": window.done,
                **table_stats(self.cfg.url, self.table)}

    def run(self, on_sample: Callable[[dict[str, Any]], None] | None = None
            ) -> list[dict[str, Any]]:
        cfg = self.cfg
        threads = [threading.Thread(target=self._guard(self._produce), daemon=True)]
        threads += [threading.Thread(target=self._guard(self._consume), daemon=True)
                    for _ in range(cfg.consumers)]
        samples: list[dict[str, Any]] = []
        snapshot: psycopg.Connection[Any] | None = None
        start = last = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            while not self.stop.is_set() and (t := time.monotonic() - start) < cfg.seconds:
                if snapshot is None and cfg.snapshot_at_s is not None and t >= cfg.snapshot_at_s:
                    snapshot = hold_snapshot(cfg.url, self.table)
                wait = min(cfg.sample_s - (time.monotonic() - last), cfg.seconds - t)
                if self.stop.wait(max(wait, 0.0)):
                    break
                now = time.monotonic()
                samples.append(self._sample(now - start, now - last))
                samples[-1]["snapshot_held"] = snapshot is not None
                last = now
                if on_sample is not None:
                    on_sample(samples[-1])
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=30)
            if snapshot is not None:
                snapshot.close()
            self.db.close()
        if self.errors:
            raise self.errors[0]
        return samples


def summarize(samples: list[dict[str, Any]], first_s: float, last_s: float) -> dict[str, Any]:
    """Medians of the first and last ``*_s`` seconds, and their ratios (last / first)."""
    end = samples[-1]["t_s"] if samples else 0.0
    head = [s for s in samples if s["t_s"] <= first_s]
    tail = [s for s in samples if s["t_s"] > end - last_s]

    out: dict[str, Any] = {}
    for key in ("rate_per_s", "pickup_p99_ms", "poll_p99_ms"):
        a, b = median_of(head, key), median_of(tail, key)
        out[key] = {"first": a, "last": b, "ratio": round(b / a, 3) if a and b else None}

    def size_mb(rows: list[dict[str, Any]]) -> float:
        mb = [(r["table_bytes"] + r["index_bytes"]) / 1024 / 1024 for r in rows]
        return round(statistics.median(mb), 1) if mb else 0.0

    out["size_mb"] = {"first": size_mb(head), "last": size_mb(tail)}
    out["max_table_bytes"] = max((s["table_bytes"] for s in samples), default=0)
    out["max_index_bytes"] = max((s["index_bytes"] for s in samples), default=0)
    out["max_dead_tuples"] = max((s["dead_tuples"] for s in samples), default=0)
    return out


# -- the HOT-acquire alternative ---------------------------------------------------------

#: The prototype's own clock expression and lease, as its statements inline them.
_NOW = "(extract(epoch FROM now()) * 1000)::bigint"
_LEASE_MS = 60_000


class _Env:
    """The little of an Envelope the steady run reads."""

    __slots__ = ("id", "lock", "scheduled_at_initially_ms")

    def __init__(self, id: int, lock: str, at: int) -> None:  # noqa: A002
        self.id, self.lock, self.scheduled_at_initially_ms = id, lock, at


class HotAcquireQueue:
    """An acquire that changes no indexed column, so PostgreSQL can make it a HOT update and
    leave no index entry behind: the lease lives in its own column (``lease_until``, not
    indexed) instead of moving ``scheduledAt``, and each page keeps room for the new version
    (``fillfactor = 50``). Only what the steady run calls (offer_batch, poll, ack_many), on a
    table of its own: a reference design to measure delayq's poll against, not a queue."""

    TABLE = "hot_queue"

    def __init__(self, db: Database, kind: str) -> None:
        self.db, self.kind = db, kind
        db.execute(f"""
            CREATE TABLE IF NOT EXISTS {self.TABLE} (
                id bigserial PRIMARY KEY, kind text NOT NULL, key text NOT NULL,
                payload bytea NOT NULL, scheduled_at bigint NOT NULL,
                lease_until bigint, lock text
            ) WITH (fillfactor = 50)""")
        db.execute(f"CREATE INDEX IF NOT EXISTS hot_queue_due ON {self.TABLE} (kind, scheduled_at)")

    def offer_batch(self, items: list[tuple[str, bytes, Any]], can_update: bool = False) -> None:
        keys = [k for k, _, _ in items]
        payloads = [p for _, p, _ in items]
        self.db.execute(f"""
            INSERT INTO {self.TABLE} (kind, key, payload, scheduled_at)
            SELECT %(kind)s, k, p, {_NOW} FROM unnest(%(keys)s::text[], %(payloads)s::bytea[])
                AS s(k, p)""", {"kind": self.kind, "keys": keys, "payloads": payloads})

    def poll(self, n: int) -> tuple[list[_Env], None]:
        lock = str(uuid.uuid4())

        def work(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            return conn.execute(f"""
                WITH picked AS (
                    SELECT id FROM {self.TABLE}
                    WHERE kind = %(kind)s AND scheduled_at <= {_NOW}
                      AND (lease_until IS NULL OR lease_until <= {_NOW})
                    ORDER BY scheduled_at LIMIT %(n)s FOR UPDATE SKIP LOCKED)
                UPDATE {self.TABLE} SET lock = %(lock)s, lease_until = {_NOW} + {_LEASE_MS}
                WHERE id = ANY(ARRAY(SELECT id FROM picked))
                RETURNING id, scheduled_at""",
                {"kind": self.kind, "n": n, "lock": lock}).fetchall()

        rows = self.db.run(work, relaxed=True)
        return [_Env(r[0], lock, r[1]) for r in rows], None

    def ack_many(self, envs: list[_Env]) -> int:
        """Each row matched on its own (id, lock) pair by the position of its id, as delayq's
        ``ack_many`` does: joined with the pairs instead, the planner can compare every row
        with every pair, and the comparison would measure that, not the acquire."""
        return self.db.execute(f"""
            DELETE FROM {self.TABLE} AS t
            WHERE t.id = ANY(%(ids)s::bigint[])
              AND t.lock = (%(locks)s::text[])[array_position(%(ids)s::bigint[], t.id)]""",
            {"ids": [e.id for e in envs], "locks": [e.lock for e in envs]}, relaxed=True)


def load_far_rows_hot(url: str, kind: str, n: int) -> None:
    """The far-future backlog of the steady run, in the prototype's table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            INSERT INTO {HotAcquireQueue.TABLE} (kind, key, payload, scheduled_at)
            SELECT %(kind)s, 'far-' || i, '\\x00', {_NOW} + %(far)s + i
            FROM generate_series(1, %(n)s) AS i""", {"kind": kind, "n": n, "far": FAR_FUTURE_MS})
