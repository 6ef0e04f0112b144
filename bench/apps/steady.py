"""The queue core under a steady load, sampled over time: the churn scenario, also run for
13 s by ``tests/integration/test_churn_short.py``.

One producer thread offers ``rate`` rows a second (due now, batched every 20 ms), consumer
threads poll up to ``batch`` rows and ack them as the transport does (relaxed commits, the
low watermark). Every ``sample_s`` a sample records the window's executed rate, pick-up
latency (ack time minus the row's due time) p50/p99, the poll's p99, and the table's size,
index size and dead tuples. ``far_rows`` far-future rows of the same kind sit in the table.

    python steady.py URL SECONDS RATE FAR_ROWS   # prints the summary as JSON
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from delayq_transport import Database, DelayedQueue

TABLE = "delayed_queue"
PRODUCE_TICK_S = 0.02
IDLE_SLEEP_S = 0.005


def load_far_rows(url: str, kind: str, n: int) -> None:
    """``n`` rows of ``kind`` due in 30 days (generate_series, a million per statement),
    then VACUUM ANALYZE: seconds for millions, where offers would take hours."""
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, n, 1_000_000):
            conn.execute("""
                INSERT INTO delayed_queue ("pKey", "pKind", payload, "scheduledAt",
                                           "scheduledAtInitially", "createdAt")
                SELECT 'far-' || i, %(kind)s, '\\x00', t + i, t + i, t
                FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i,
                     (SELECT (extract(epoch FROM now()) * 1000)::bigint + 2592000000 AS t) AS n
                """, {"kind": kind, "lo": lo, "hi": min(lo + 1_000_000, n) - 1})
        conn.execute("VACUUM ANALYZE delayed_queue")


def table_stats(url: str) -> dict[str, Any]:
    """Sizes, dead tuples, and the pages of the (pKind, scheduledAt) index read so far."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("""
            SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), s.n_dead_tup,
                   (SELECT sum(i.idx_blks_hit + i.idx_blks_read) FROM pg_statio_user_indexes AS i
                    WHERE i.relid = c.oid AND i.indexrelname LIKE '%%KindPlusScheduledAt%%')
            FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
            WHERE c.oid = %s::regclass""", [TABLE]).fetchone()
    assert row is not None
    return dict(zip(("table_bytes", "index_bytes", "dead_tuples", "kind_index_pages"), row,
                    strict=True))


@dataclass
class SteadyConfig:
    url: str
    seconds: float
    rate: float
    far_rows: int = 0
    consumers: int = 2
    batch: int = 100
    sample_s: float = 10.0
    kind: str = "steady"
    payload: bytes = b"x" * 200


@dataclass
class Window:
    pickups_ms: list[float] = field(default_factory=list)
    polls_ms: list[float] = field(default_factory=list)
    done: int = 0


def prepare(cfg: SteadyConfig) -> None:
    """Schema and far-future rows for ``cfg`` on a fresh database."""
    with Database(cfg.url, max_size=1) as db:
        DelayedQueue(db, kind=cfg.kind)
    load_far_rows(cfg.url, cfg.kind, cfg.far_rows)


def _p(values: list[float], q: int) -> float | None:
    if len(values) < 2:
        return round(values[0], 2) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 2)


class SteadyRun:
    """Threads of one run; :meth:`run` returns its samples."""

    def __init__(self, cfg: SteadyConfig) -> None:
        self.cfg, self.stop, self.lock = cfg, threading.Event(), threading.Lock()
        self.window, self.errors = Window(), list[BaseException]()
        #: Rows offered, handed to a consumer, and acked (an ack that deleted its row), over
        #: the run: a row delivered twice shows as delivered > acked.
        self.produced = self.delivered = self.acked = 0
        self.db = Database(cfg.url, max_size=cfg.consumers + 2)
        self.queue = DelayedQueue(self.db, kind=cfg.kind, relaxed_consumer_commits=True,
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
        owed, start, tick = 0.0, time.monotonic(), 0
        while not self.stop.is_set():
            owed += self.cfg.rate * PRODUCE_TICK_S
            n, owed = int(owed), owed - int(owed)
            if n:
                self.queue.offer_batch([(uuid.uuid4().hex, self.cfg.payload, None)
                                        for _ in range(n)], can_update=False)
                with self.lock:
                    self.produced += n
            tick += 1
            self.stop.wait(max(start + tick * PRODUCE_TICK_S - time.monotonic(), 0.0))

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
                "pickup_p99_ms": _p(window.pickups_ms, 99),
                "poll_p99_ms": _p(window.polls_ms, 99), "polls": len(window.polls_ms),
                "delivered": window.done, **table_stats(self.cfg.url)}

    def run(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        threads = [threading.Thread(target=self._guard(self._produce), daemon=True)]
        threads += [threading.Thread(target=self._guard(self._consume), daemon=True)
                    for _ in range(cfg.consumers)]
        samples: list[dict[str, Any]] = []
        start = last = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            while not self.stop.is_set() and (t := time.monotonic() - start) < cfg.seconds:
                if self.stop.wait(max(min(cfg.sample_s - (time.monotonic() - last),
                                          cfg.seconds - t), 0.0)):
                    break
                now = time.monotonic()
                samples.append(self._sample(now - start, now - last))
                last = now
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=30)
            self.db.close()
        if self.errors:
            raise self.errors[0]
        return samples


def summarize(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of the first and the last third of the samples: rate, pick-up and poll p99,
    table + indexes MB; the most dead tuples seen."""
    third = max(len(samples) // 3, 1)
    out: dict[str, float] = {}
    for part, rows in (("first", samples[:third]), ("last", samples[-third:])):
        for key in ("rate_per_s", "pickup_p99_ms", "poll_p99_ms"):
            values = [r[key] for r in rows if r[key] is not None]
            out[f"{part}_{key}"] = round(statistics.median(values), 2) if values else 0.0
        out[f"{part}_mb"] = round(statistics.median(
            (r["table_bytes"] + r["index_bytes"]) / 2**20 for r in rows), 1)
    out["max_dead_tuples"] = max(r["dead_tuples"] for r in samples)
    return out


if __name__ == "__main__":
    config = SteadyConfig(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]),
                          far_rows=int(sys.argv[4]), sample_s=max(float(sys.argv[2]) / 30, 2))
    prepare(config)
    print(json.dumps(summarize(SteadyRun(config).run())))
