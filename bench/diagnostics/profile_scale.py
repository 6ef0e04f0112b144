"""Where the time goes as the table grows: bench_scale's sizes part, measured per statement
instead of timed.

At each of ``--sizes`` (far-future rows topped up in the consumed queue, as bench_scale does,
then a CHECKPOINT): one publish of ``--tasks`` no-ops by two producer processes, then one
``celery worker`` (bench_celery's settings) drains them. For the publish, the worker's
start-up and the drain, per statement from ``pg_stat_statements``: calls per task, execution
µs per call, shared buffers hit / read (from the OS) / dirtied per call, full-page images and
WAL bytes per call; and ``pg_stat_wal``, ``pg_stat_bgwriter`` (checkpoints inside the phase),
``pg_statio_user_indexes`` / ``_tables`` differences.

``pg_stat_statements`` must be preloaded, which the shared development server is not: run
against a throwaway cluster with the shared server's ``shared_buffers`` and ``autovacuum``
(``initdb`` as user postgres; ``shared_preload_libraries = 'pg_stat_statements'``,
``pg_stat_statements.track = all``, ``track_io_timing = on``). Hold the bench lock.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common, the harness

import _celery as cel  # noqa: E402
from _common import checkpoint, console, fresh_database, load_far_rows  # noqa: E402

from delayq_transport import DelayedQueue  # noqa: E402

STATEMENTS = """
    SELECT query, calls, total_exec_time, shared_blks_hit, shared_blks_read, shared_blks_dirtied,
           shared_blks_written, wal_fpi, wal_bytes
    FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s"""
PER_CALL = ("us", "hit", "read", "dirtied", "written", "fpi", "wal_bytes")
WAL = "SELECT wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal"
BGWRITER = """SELECT checkpoints_timed + checkpoints_req, buffers_checkpoint, buffers_backend,
                     buffers_alloc FROM pg_stat_bgwriter"""
STATIO = """SELECT indexrelname, idx_blks_read, idx_blks_hit FROM pg_statio_user_indexes
            UNION ALL SELECT relname, heap_blks_read, heap_blks_hit FROM pg_statio_user_tables"""


def _snapshot(admin_url: str, db_url: str) -> dict[str, Any]:
    dbname = db_url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        statements = {r[0]: [float(v) for v in r[1:]]
                      for r in conn.execute(STATEMENTS, (dbname,)).fetchall()}
        wal, bgwriter = conn.execute(WAL).fetchone(), conn.execute(BGWRITER).fetchone()
    with psycopg.connect(db_url, autocommit=True) as conn:
        statio = {r[0]: (int(r[1]), int(r[2])) for r in conn.execute(STATIO).fetchall()}
    return {"statements": statements, "wal": wal, "bgwriter": bgwriter, "statio": statio}


def _delta(a: dict[str, Any], b: dict[str, Any], tasks: int) -> dict[str, Any]:
    rows = []
    for query, now in b["statements"].items():
        d = [x - y for x, y in zip(now, a["statements"].get(query, [0.0] * len(now)),
                                   strict=True)]
        if d[0] <= 0:
            continue
        d[1] *= 1000  # ms -> µs
        rows.append({"statement": " ".join(query.split())[:80],
                     "calls_per_task": round(d[0] / tasks, 4),
                     "us_per_task": round(d[1] / tasks, 1),
                     **{k: round(v / d[0], 3) for k, v in zip(PER_CALL, d[1:], strict=True)}})
    rows.sort(key=lambda r: -r["us_per_task"])
    diff = lambda x, y: [int(p) - int(q) for p, q in zip(x, y, strict=True)]  # noqa: E731
    return {"exec_us_per_task": round(sum(r["us_per_task"] for r in rows), 1),
            "statements": rows[:8],
            "wal_records_fpi_bytes": diff(b["wal"], a["wal"]),
            "checkpoints_bufckpt_bufbackend_alloc": diff(b["bgwriter"], a["bgwriter"]),
            "read_hit_by_relation": {k: diff(v, a["statio"].get(k, (0, 0)))
                                     for k, v in b["statio"].items()}}


def profile_size(cfg: cel.Settings, db_url: str, queue: str, size: int) -> dict[str, Any]:
    run = cel.delayq_run(db_url, cfg, queue, f"delayq_{size}")
    n = cfg.throughput_n
    key = cel.counter_key(cfg, run.name, "prof", uuid.uuid4().hex[:8])
    jobs = cel.noop_jobs(key, n)
    s0, t0 = _snapshot(cfg.admin_url, db_url), time.time()
    with cel.Producers(run.env, cfg.producers) as producers:
        done = producers.submit(cel.publish, jobs)
        while len(done) < len(jobs) and not producers.errors:
            time.sleep(0.02)
    publish_s = time.time() - t0
    s1 = _snapshot(cfg.admin_url, db_url)
    with cel.running_worker(run.env, f"prof-{run.name}", cfg):
        s2, started = _snapshot(cfg.admin_url, db_url), time.time()
        client = cel.counter_client(cfg)
        while cel.count_of(client, key) < n and time.time() - started < 600:
            time.sleep(0.02)
        done_at = client.get(f"{key}:done")
        s3 = _snapshot(cfg.admin_url, db_url)
    return {"far_rows": size, "publish_s": round(publish_s, 3),
            "drain_s": round(float(done_at) - started, 3) if done_at else None,
            "publish": _delta(s0, s1, n), "startup": _delta(s1, s2, 1),
            "drain": _delta(s2, s3, n)}


@click.command()
@click.option("--sizes", default="10000,1000000,3000000,5000000", show_default=True)
@click.option("--tasks", default=5000, show_default=True)
@click.option("--admin-url", default="postgresql://postgres@127.0.0.1:5499/postgres",
              show_default=True, help="A cluster with pg_stat_statements preloaded.")
@click.option("--output", default="", help="Write the JSON results here.")
def main(sizes: str, tasks: int, admin_url: str, output: str) -> None:
    """Per-statement cost of publish, worker start-up and drain at each table size."""
    cfg = cel.Settings.build(True, producers=2, admin_url=admin_url, redis_db=13, counter_db=14)
    cfg = dataclasses.replace(cfg, throughput_n=tasks)
    queue, loaded = f"bench_scale_{cfg.run_id}", 0
    results: list[dict[str, Any]] = []
    with fresh_database(admin_url, prefix="delayq_prof10_scale") as db_url:
        DelayedQueue(db_url, kind=queue).close()
        for size in (int(s) for s in sizes.split(",")):
            load_far_rows(db_url, queue, size - loaded, first=loaded)
            loaded = size
            checkpoint(admin_url)
            results.append(profile_size(cfg, db_url, queue, size))
            r = results[-1]
            console.print(f"{size:,}: drain {r['drain_s']} s, DB execution "
                          f"{r['drain']['exec_us_per_task']} µs per task")
            if output:
                Path(output).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
