"""Does a lower fillfactor make the lease cheaper? WAL bytes and HOT updates per message.

A delivery is an INSERT (publish), an UPDATE (the lease: ``lockUuid`` and ``scheduledAt``, both
indexed) and a DELETE (the ack). An UPDATE can be HOT (no new index entries, the new version on
the same page) only when no indexed column changes, so the lease, its extension and a release
are never HOT whatever the fillfactor; what free space on the page can still change is whether
the new version stays on its page (one heap page touched and logged instead of two). This
measures it instead of assuming it: for each fillfactor, on a fresh database of a throw-away
cluster of its own (WAL is counted cluster-wide, so nobody else's may land in it; full-page
writes on, as in production), ``--cycles`` messages go through publish -> acquire -> ack the
way the kombu transport sends them (one ``offer`` per publish, polls of 8 rows under one lock,
``ack_many`` per poll, consumer statements on the relaxed pool); every 10th batch its leases
are extended once before the ack, every 10th other batch released and acquired again. Each
step's WAL is the ``pg_current_wal_lsn()`` difference around it; HOT updates and table size
come from ``pg_stat_user_tables`` / ``pg_total_relation_size`` at the end (autovacuum on, as
the queue's migration 4 sets it).

    python bench/diagnostics/fillfactor.py --cycles 100000 --fillfactors 100,90,70,50
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # topology.clusters

from _common import console, markdown_table, progress_bar  # noqa: E402
from topology.clusters import Cluster, scratch_root  # noqa: E402

from delayq_transport.core.queue import DelayedQueue  # noqa: E402

PAYLOAD = b"x" * 1200  # about a Celery no-op message
BATCH = 96  # messages published, then consumed, per step
POLL = 8  # rows per poll: prefetch 4 x concurrency 2, the benchmark's worker
STEPS = ("publish", "acquire", "ack", "extend", "release")
SETTINGS = {"full_page_writes": "on", "shared_buffers": "'128MB'", "max_wal_size": "'1GB'"}


@dataclass
class Tally:
    """WAL bytes and rows of each step over one fillfactor's run."""

    wal: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STEPS, 0))
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STEPS, 0))
    seconds: float = 0.0


class Lsn:
    """The cluster's current WAL position from a connection of its own."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)

    def __call__(self) -> int:
        row = self.conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])


def _step(tally: Tally, lsn: Lsn, name: str, work: Any) -> Any:
    before = lsn()
    out = work()
    tally.wal[name] += lsn() - before
    return out


def _cycle(q: DelayedQueue, tally: Tally, lsn: Lsn, batch: int, base: int) -> None:
    """One batch: publish it, acquire it in polls of POLL, extend or release some, ack."""
    def publish() -> None:
        for i in range(batch):
            q.offer(f"m{base + i}", PAYLOAD, can_update=False, durable=False)

    _step(tally, lsn, "publish", publish)
    tally.rows["publish"] += batch
    polls = _step(tally, lsn, "acquire", lambda: _acquire(q, batch))
    tally.rows["acquire"] += sum(len(p) for p in polls)
    if (base // batch) % 10 == 5:  # released, then acquired again (a reject/requeue)
        released = _step(tally, lsn, "release", lambda: [q.release(p) for p in polls])
        tally.rows["release"] += sum(released)
        polls = _step(tally, lsn, "acquire", lambda: _acquire(q, batch))
        tally.rows["acquire"] += sum(len(p) for p in polls)
    if (base // batch) % 10 == 0:  # long tasks: their lease is extended once
        extended = _step(tally, lsn, "extend", lambda: [q.extend_lease([p[0].lock])
                                                         for p in polls])
        tally.rows["extend"] += sum(extended)
    acked = _step(tally, lsn, "ack", lambda: [q.ack_many(p) for p in polls])
    tally.rows["ack"] += sum(acked)


def _acquire(q: DelayedQueue, n: int) -> list[list[Any]]:
    polls: list[list[Any]] = []
    while sum(len(p) for p in polls) < n:
        got = q.try_poll_many(POLL)
        if not got:
            break
        polls.append(got)
    return polls


def _table(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd, n_tup_ins, n_tup_del,"
            " pg_relation_size(relid), pg_indexes_size(relid), autovacuum_count"
            " FROM pg_stat_user_tables WHERE relname = 'delayed_queue'").fetchone()
    assert row is not None
    keys = ("updates", "hot_updates", "inserts", "deletes", "heap_bytes", "index_bytes",
            "autovacuums")
    return dict(zip(keys, row, strict=True))


def run_one(cluster: Cluster, fillfactor: int, cycles: int, backlog: int,
            progress: Any) -> dict[str, Any]:
    dbname = f"ff{fillfactor}"
    cluster.execute(f"DROP DATABASE IF EXISTS {dbname}")
    cluster.execute(f"CREATE DATABASE {dbname}")
    url = cluster.url(dbname)
    tally, lsn = Tally(), Lsn(url)
    with DelayedQueue(url, kind="celery", relaxed_consumer_commits=True) as q:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE delayed_queue SET (fillfactor = {fillfactor})")
        at = q.now() + timedelta(hours=1)
        q.offer_batch([(f"far{i}", PAYLOAD, at) for i in range(backlog)], durable=False)
        bar = progress.add_task(f"fillfactor {fillfactor}", total=cycles, rate="",
                                unit="messages")
        start = time.monotonic()
        for base in range(0, cycles, BATCH):
            _cycle(q, tally, lsn, min(BATCH, cycles - base), base)
            done = base + BATCH
            progress.update(bar, completed=min(done, cycles),
                            rate=f"{done / (time.monotonic() - start):7.0f}/s")
        tally.seconds = time.monotonic() - start
    lsn.conn.close()
    stats = _settled_stats(url, cycles)
    return {"fillfactor": fillfactor, "messages": cycles, "seconds": round(tally.seconds, 1),
            "wal_bytes_per_row": {s: round(tally.wal[s] / tally.rows[s], 1) if tally.rows[s]
                                  else None for s in STEPS},
            "rows": tally.rows, **stats}


def _settled_stats(url: str, cycles: int) -> dict[str, Any]:
    """The table's counters once every closed backend has reported them (bounded wait)."""
    deadline = time.monotonic() + 30
    stats = _table(url)
    while stats["deletes"] < cycles and time.monotonic() < deadline:
        time.sleep(0.2)
        stats = _table(url)
    return stats


def report(results: list[dict[str, Any]]) -> str:
    headers = ["fillfactor", *(f"{s} WAL B/row" for s in STEPS),
               "lease+ack WAL B/msg", "HOT / updates", "heap MB", "indexes MB", "msgs/s"]
    rows = []
    for r in results:
        per = r["wal_bytes_per_row"]
        lease_ack = (per["acquire"] or 0) + (per["ack"] or 0)
        hot = r["hot_updates"] / r["updates"] if r["updates"] else 0.0
        rows.append([str(r["fillfactor"]), *(f"{per[s]:,.0f}" if per[s] is not None else "—"
                                              for s in STEPS),
                     f"{lease_ack:,.0f}", f"{r['hot_updates']:,} / {r['updates']:,} "
                     f"({hot:.1%})", f"{r['heap_bytes'] / 2**20:.1f}",
                     f"{r['index_bytes'] / 2**20:.1f}", f"{r['messages'] / r['seconds']:,.0f}"])
    return markdown_table(headers, rows)


@click.command()
@click.option("--cycles", default=100_000, show_default=True,
              help="Messages published, acquired and acked per fillfactor.")
@click.option("--fillfactors", default="100,90,70,50", show_default=True)
@click.option("--backlog", default=10_000, show_default=True,
              help="One-hour countdowns in the table throughout (never touched).")
@click.option("--rounds", default=1, show_default=True,
              help="Repeat the fillfactors, interleaved (a noisy machine).")
def main(cycles: int, fillfactors: str, backlog: int, rounds: int) -> None:
    """WAL bytes per publish / lease / ack / extension / release and HOT ratio per fillfactor."""
    factors = [int(f) for f in fillfactors.split(",")]
    root = scratch_root("delayq-fillfactor-")
    cluster = Cluster.create(root, "ff", SETTINGS)
    results = []
    try:
        cluster.start()
        with progress_bar() as progress:
            for _ in range(rounds):
                for ff in factors:
                    cluster.execute("CHECKPOINT")
                    results.append(run_one(cluster, ff, cycles, backlog, progress))
    finally:
        cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)
    console.print(report(results))


if __name__ == "__main__":
    main()
