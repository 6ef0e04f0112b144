"""A steady queue load at the core level, sampled over time (issue 10, parts 2 and 3).

One producer thread offers ``rate`` rows a second (due now, batched every 20 ms), consumer
threads poll up to ``batch`` rows and ack them, as the transport does (relaxed commits, the
watermark on or off). Every ``sample_s`` a sampler records the window's executed rate,
pick-up latency (ack time minus the row's due time) p50/p99, the poll statement's p99, and
the table's size, index size and dead tuples. ``far_rows`` far-future rows of the same kind
sit in the table the whole time; a REPEATABLE READ snapshot can be held from ``snapshot_at_s``
on (what ``pg_dump`` does).

``variant`` picks the consumer: ``watermark`` (delayq's poll), ``no_watermark`` (the poll
from the bottom of the index, delayq before issue 10) or ``hot_acquire`` (the alternative of
an acquire that writes no indexed column, see ``_hot_acquire.py``).
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
from _hot_acquire import HotAcquireQueue, load_far_rows_hot

from delayq_transport import Database, DelayedQueue

TABLE = "delayed_queue"
VARIANTS = ("watermark", "no_watermark", "hot_acquire")
PRODUCE_TICK_S = 0.02
IDLE_SLEEP_S = 0.005
FAR_FUTURE_MS = 30 * 86_400_000


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


def load_far_rows(url: str, kind: str, n: int, table: str = TABLE, first: int = 0) -> float:
    """Rows ``first`` to ``first + n - 1`` due in 30 days, by generate_series (seconds for
    millions); returns seconds."""
    start = time.monotonic()
    step = 1_000_000
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(first, first + n, step):
            conn.execute(f"""
                INSERT INTO {table} ("pKey", "pKind", payload, "scheduledAt",
                                     "scheduledAtInitially", "createdAt")
                SELECT 'far-' || i, %(kind)s, '\\x00', t + i, t + i, t
                FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i,
                     (SELECT (extract(epoch FROM now()) * 1000)::bigint + %(far)s AS t) AS n
            """, {"kind": kind, "lo": lo, "hi": min(lo + step, first + n) - 1,
                  "far": FAR_FUTURE_MS})
    return time.monotonic() - start


def prepare(cfg: SteadyConfig) -> float:
    """Schema and far-future rows for ``cfg`` on a fresh database; returns the load seconds."""
    with Database(cfg.url, max_size=1) as db:
        if cfg.variant == "hot_acquire":
            HotAcquireQueue(db, cfg.kind)
        else:
            DelayedQueue(db, kind=cfg.kind)
    start = time.monotonic()
    if cfg.far_rows and cfg.variant == "hot_acquire":
        load_far_rows_hot(cfg.url, cfg.kind, cfg.far_rows, FAR_FUTURE_MS)
    elif cfg.far_rows:
        load_far_rows(cfg.url, cfg.kind, cfg.far_rows)
    with psycopg.connect(cfg.url, autocommit=True) as conn:
        table = HotAcquireQueue.TABLE if cfg.variant == "hot_acquire" else TABLE
        conn.execute(f"VACUUM ANALYZE {table}")
    return time.monotonic() - start


def table_stats(url: str, table: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("""
            SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), s.n_dead_tup, s.n_live_tup,
                   s.autovacuum_count, s.autoanalyze_count
            FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
            WHERE c.oid = %s::regclass""", [table]).fetchone()
    assert row is not None
    keys = ("table_bytes", "index_bytes", "dead_tuples", "live_tuples", "autovacuums",
            "autoanalyzes")
    return dict(zip(keys, row, strict=True))


def _p(values: list[float], q: int) -> float | None:
    if len(values) < 2:
        return round(values[0], 2) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 2)


class SteadyRun:
    """Threads of one run; :meth:`run` returns its samples."""

    def __init__(self, cfg: SteadyConfig) -> None:
        self.cfg = cfg
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.window = Window()
        self.errors: list[BaseException] = []
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
            tick += 1
            pause = start + tick * PRODUCE_TICK_S - time.monotonic()
            if pause > 0:
                self.stop.wait(pause)

    def _consume(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            got = self.queue.poll(self.cfg.batch)[0]
            poll_ms = (time.perf_counter() - t0) * 1000
            if got:
                self.queue.ack_many(got)
            now_ms = time.time() * 1000
            with self.lock:
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
                "polls": len(window.polls_ms), **table_stats(self.cfg.url, self.table)}

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


def hold_snapshot(url: str, table: str) -> psycopg.Connection[Any]:
    """A REPEATABLE READ transaction that has read the table: its snapshot pins the xmin
    horizon (nothing deleted after it can be vacuumed) until the connection closes."""
    conn = psycopg.connect(url)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute(f"SELECT count(*) FROM {table} WHERE false").fetchone()
    return conn


def summarize(samples: list[dict[str, Any]], first_s: float, last_s: float) -> dict[str, Any]:
    """Medians of the first and last ``*_s`` seconds, and their ratios (last / first)."""
    end = samples[-1]["t_s"] if samples else 0.0
    head = [s for s in samples if s["t_s"] <= first_s]
    tail = [s for s in samples if s["t_s"] > end - last_s]

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(vals), 2) if vals else None

    out: dict[str, Any] = {}
    for key in ("rate_per_s", "pickup_p99_ms", "poll_p99_ms"):
        a, b = med(head, key), med(tail, key)
        out[key] = {"first": a, "last": b, "ratio": round(b / a, 3) if a and b else None}

    def size_mb(rows: list[dict[str, Any]]) -> float:
        mb = [(r["table_bytes"] + r["index_bytes"]) / 1024 / 1024 for r in rows]
        return round(statistics.median(mb), 1) if mb else 0.0

    out["size_mb"] = {"first": size_mb(head), "last": size_mb(tail)}
    out["max_table_bytes"] = max((s["table_bytes"] for s in samples), default=0)
    out["max_index_bytes"] = max((s["index_bytes"] for s in samples), default=0)
    out["max_dead_tuples"] = max((s["dead_tuples"] for s in samples), default=0)
    return out
