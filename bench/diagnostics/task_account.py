"""The per-task account: what one Celery no-op task costs PostgreSQL, from apply_async to ack.

Counts, not times, so it can be read on a busy machine: statements (top level: each one a
round trip), transactions, heap rows inserted / updated (HOT or not) / deleted, index entries
written, WAL records and bytes (with full-page images), NOTIFYs, per task, by statement and in
total, for each delayq variant named (``delayq``, ``delayq@REV``, ``delayq~option=value``:
bench/_variants.py). CPU per task of the producers, the worker's main process, its pool
children and PostgreSQL is given beside them, labelled with the load average: on a busy
machine it is indicative only.

Each variant runs twice on fresh databases, with ``--small`` and ``--tasks`` tasks: the
benchmark's producer processes publish them with nothing consuming (the ``publish`` step),
then a ``celery worker`` with the benchmark's settings runs them until every row was acked (the
``drain`` step); with ``--e2e`` instead both at once, as in ``bench_celery.py``'s throughput
phase, where how many rows a poll finds depends on the machine's timing. The processes of each
step are stopped before its counters are read, so every backend flushes its statistics on exit.
The difference of the two runs divided by the difference of their sizes is the cost per task,
without start-up, warm-up and tail.

Needs a cluster of its own with ``pg_stat_statements`` preloaded (``--admin-url``): the WAL and
background counters are cluster-wide (``pg_stat_wal``), and they are reset per run.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common, the harness

import _celery as cel  # noqa: E402
from _celery_cpu import CpuMeter  # noqa: E402
from _common import checkpoint, console, markdown_table  # noqa: E402

_STATEMENTS = """
SELECT s.query, s.toplevel, sum(s.calls)::bigint, sum(s.rows)::bigint,
       sum(s.total_exec_time)::float8, sum(s.wal_records)::bigint, sum(s.wal_bytes)::bigint,
       sum(s.wal_fpi)::bigint
FROM pg_stat_statements AS s JOIN pg_database AS d ON d.oid = s.dbid
WHERE d.datname = %s GROUP BY s.query, s.toplevel"""
_DATABASE = """
SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted
FROM pg_stat_database WHERE datname = %s"""
_WAL = "SELECT wal_records, wal_fpi, wal_bytes::bigint, wal_write, wal_sync FROM pg_stat_wal"
_TABLE = """
SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count, autoanalyze_count,
       (SELECT count(*) FROM pg_index WHERE indrelid = relid)
FROM pg_stat_user_tables WHERE relname = 'delayed_queue'"""


_COUNT = "SELECT count(*) FROM delayed_queue"
#: How each of delayq's statements is recognised in pg_stat_statements (first match wins).
_MARKS = (("announce", ", p) FROM unnest("),
          ("offer_batch_insert", "AS s(key, kind, payload, at)"),
          ("offer_insert", "VALUES ($1"),
          ("try_poll_many", "FOR UPDATE SKIP LOCKED"),
          ("ack_many", "array_position"),
          ("extend_lease", 'SET "scheduledAt" = COALESCE'),
          ("bindings_for_exchange", '"autoDelete" OR'),
          ("probe_below_watermark", "LEAST(k.floor"))


def _label(query: str) -> str:
    text = " ".join(query.split())
    for name, mark in _MARKS:
        if mark in text:
            return name
    return text[:70]


def _read(admin_url: str, db_url: str) -> dict[str, Any]:
    dbname = db_url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        statements = admin.execute(_STATEMENTS, (dbname,)).fetchall()
        database = admin.execute(_DATABASE, (dbname,)).fetchone()
        wal = admin.execute(_WAL).fetchone()
    with psycopg.connect(db_url, autocommit=True) as conn:
        table = conn.execute(_TABLE).fetchone()
    by: dict[str, list[float]] = {}
    for query, top, calls, rows, ms, wal_rec, wal_b, fpi in statements:
        key = ("" if top else "(nested) ") + _label(query)
        acc = by.setdefault(key, [0, 0, 0.0, 0, 0, 0])
        for i, v in enumerate((calls, rows, ms, wal_rec, wal_b, fpi)):
            acc[i] += v
    assert database is not None and wal is not None
    table = table or (0,) * 7  # before the first process made the table
    return {"statements": by, "database": list(database), "wal": list(wal),
            "table": list(table)}


def _reset(admin_url: str) -> None:
    checkpoint(admin_url)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_stat_reset_shared('wal')")


def _wait_empty(db_url: str, timeout: float = 60.0) -> None:
    """Every row acked (acks are flushed in batches), bounded."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(_COUNT).fetchone()
            if row and row[0] == 0:
                return
            time.sleep(0.1)
    raise TimeoutError("rows left unacked")


def _snapshot(cfg: cel.Settings, db_url: str, cpu: dict[str, Any]) -> dict[str, Any]:
    time.sleep(1.5)  # the backends of the stopped processes exit and flush their counters
    got = _read(cfg.admin_url, db_url)
    got.update(cpu_us=cpu, load=os.getloadavg()[0])
    return got


def _minus(b: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    """Counters of snapshot ``b`` less those of the earlier snapshot ``a``."""
    zero = [0] * 6
    return {"statements": {k: [y - x for x, y in zip(a["statements"].get(k, zero), v,
                                                     strict=True)]
                           for k, v in b["statements"].items()},
            **{k: [y - x for x, y in zip(a[k], b[k], strict=True)]
               for k in ("database", "wal")},
            "table": [y - x for x, y in zip(a["table"][:6], b["table"][:6], strict=True)]
            + b["table"][6:],
            "cpu_us": b["cpu_us"], "load": b["load"]}


def _publish(run: Any, cfg: cel.Settings, producers: cel.Producers, key: str, n: int) -> None:
    jobs = cel.noop_jobs(key, n)
    if cfg.producer_threads > 1:
        done = producers.submit(cel.publish_threaded,
                                [(cfg.producer_threads, job) for job in jobs])
    else:
        done = producers.submit(cel.publish, jobs)
    deadline = time.monotonic() + 300
    while len(done) < len(jobs) and time.monotonic() < deadline:
        if producers.errors:
            raise producers.errors[0]
        time.sleep(0.05)


def _drained(cfg: cel.Settings, key: str, n: int, db_url: str) -> None:
    client, t0 = cel.counter_client(cfg), time.monotonic()
    while cel.count_of(client, key) < n and time.monotonic() - t0 < 300:
        time.sleep(0.05)
    _wait_empty(db_url)


def one_run(name: str, cfg: cel.Settings, n: int, e2e: bool) -> dict[str, dict[str, Any]]:
    """Counters of one run: ``e2e`` (producers and worker together) or ``publish`` (the
    producers alone, nothing consuming) then ``drain`` (the worker alone on what they left)."""
    key = cel.counter_key(cfg, cel.safe_name(name), "acct", uuid.uuid4().hex[:8])
    with cel.broker_state(name, "account", cfg) as run:
        assert run.db_url is not None
        _reset(cfg.admin_url)
        zero = _snapshot(cfg, run.db_url, {})
        if e2e:
            with cel.running_worker(run.env, f"acct-{name}", cfg) as worker, \
                    cel.Producers(run.env, cfg.producers) as producers:
                meter = CpuMeter(run, cfg.admin_url, producers.pids(), worker.proc.pid)
                meter.start()
                _publish(run, cfg, producers, key, n)
                _drained(cfg, key, n, run.db_url)
                cpu = meter.per_task(1)  # µs in total; divided by the difference later
            return {"e2e": _minus(_snapshot(cfg, run.db_url, cpu), zero)}
        with cel.Producers(run.env, cfg.producers) as producers:
            meter = CpuMeter(run, cfg.admin_url, producers.pids(), -1)
            meter.start()
            _publish(run, cfg, producers, key, n)
            cpu = meter.per_task(1)
        published = _snapshot(cfg, run.db_url, cpu)
        with cel.running_worker(run.env, f"acct-{name}", cfg) as worker:
            meter = CpuMeter(run, cfg.admin_url, [], worker.proc.pid)
            meter.start()
            _drained(cfg, key, n, run.db_url)
            cpu = meter.per_task(1)
        drained = _snapshot(cfg, run.db_url, cpu)
    return {"publish": _minus(published, zero), "drain": _minus(drained, published)}


def _diff(small: dict[str, Any], big: dict[str, Any], dn: int) -> dict[str, Any]:
    """Per task: (big - small) / dn for every counter."""
    names = set(small["statements"]) | set(big["statements"])
    statements = {}
    for name in names:
        a = small["statements"].get(name, [0] * 6)
        b = big["statements"].get(name, [0] * 6)
        d = [(y - x) for x, y in zip(a, b, strict=True)]
        if d[0] <= 0:
            continue
        statements[name] = {"calls": d[0] / dn, "rows_per_call": d[1] / d[0],
                            "exec_us": d[2] * 1000 / dn, "wal_records": d[3] / dn,
                            "wal_bytes": d[4] / dn, "wal_fpi": d[5] / dn}
    per: dict[str, Any] = {}
    db = [(y - x) / dn for x, y in zip(small["database"], big["database"], strict=True)]
    wal = [(y - x) / dn for x, y in zip(small["wal"], big["wal"], strict=True)]
    tab = [(y - x) / dn for x, y in zip(small["table"][:6], big["table"][:6], strict=True)]
    indexes = big["table"][6]
    cpu = {k: (big["cpu_us"][k] - small["cpu_us"][k]) / dn
           for k in big["cpu_us"] if big["cpu_us"][k] is not None}
    # The harness' own reads (_wait_empty's count) are no part of a task.
    ours = statements.pop(_label(_COUNT), {"calls": 0.0})["calls"]
    top = {k: v for k, v in statements.items() if not k.startswith("(nested)")}
    per.update(
        statements=dict(sorted(statements.items(), key=lambda kv: -kv[1]["calls"])),
        round_trips=sum(v["calls"] for v in top.values()),
        commits=db[0] - ours, rollbacks=db[1], heap_inserted=tab[0], heap_updated=tab[1],
        heap_hot_updated=tab[2], heap_deleted=tab[3],
        index_entries=(tab[0] + tab[1] - tab[2]) * indexes, indexes=indexes,
        wal_records=wal[0], wal_fpi=wal[1], wal_bytes=wal[2], wal_writes=wal[3],
        wal_syncs=wal[4], statement_wal_bytes=sum(v["wal_bytes"] for v in top.values()),
        exec_us=sum(v["exec_us"] for v in top.values()),
        autovacuums=tab[4], cpu_us=cpu,
        load=[small["load"], big["load"]])
    return per


def account(name: str, cfg: cel.Settings, small: int, big: int, e2e: bool
            ) -> dict[str, Any]:
    a = one_run(name, cfg, small, e2e)
    b = one_run(name, cfg, big, e2e)
    return {step: _diff(a[step], b[step], big - small) for step in a}


ROWS = (("round trips (top-level statements)", "round_trips", ".2f"),
        ("transactions committed", "commits", ".2f"),
        ("heap rows inserted", "heap_inserted", ".2f"),
        ("heap rows updated (of which HOT)", "heap_updated", ".2f"),
        ("heap rows deleted", "heap_deleted", ".2f"),
        ("index entries written (derived)", "index_entries", ".2f"),
        ("WAL records", "wal_records", ".1f"), ("WAL bytes", "wal_bytes", ",.0f"),
        ("WAL full-page images", "wal_fpi", ".3f"), ("WAL writes", "wal_writes", ".3f"),
        ("WAL syncs (fsync)", "wal_syncs", ".3f"),
        ("statement execution time, µs", "exec_us", ",.0f"))


def tables(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    rows = []
    for label, key, fmt in ROWS:
        cells = []
        for name in names:
            value = results[name][key]
            if key == "heap_updated":
                cells.append(f"{value:.2f} ({results[name]['heap_hot_updated']:.2f})")
            else:
                cells.append(format(value, fmt))
        rows.append([label, *cells])
    for part in ("producers_us", "worker_main_us", "worker_pool_us", "server_us", "pg_aux_us"):
        rows.append([f"CPU µs/task, {part[:-3].replace('_', ' ')} (indicative)",
                     *(f"{results[n]['cpu_us'].get(part, 0):,.0f}" for n in names)])
    rows.append(["load average (1 min) at the two runs' starts",
                 *(" / ".join(f"{x:.1f}" for x in results[n]["load"]) for n in names)])
    out = [markdown_table(["per task", *names], rows, "l" + "r" * len(names))]
    for name in names:
        srows = [[k, f"{v['calls']:.3f}", f"{v['rows_per_call']:.2f}", f"{v['exec_us']:.0f}",
                  f"{v['wal_records']:.2f}", f"{v['wal_bytes']:.0f}"]
                 for k, v in results[name]["statements"].items() if v["calls"] >= 0.001]
        out.append(f"\n{name}, by statement (per task):\n" + markdown_table(
            ["statement", "calls", "rows/call", "exec µs", "WAL records", "WAL bytes"],
            srows, "lrrrrr"))
    return "\n".join(out)


@click.command()
@click.option("--variants", default="delayq", show_default=True,
              help="Comma-separated: delayq, delayq_durable, delayq@REV, delayq~option=value.")
@click.option("--tasks", default=3000, show_default=True, help="Tasks of the larger run.")
@click.option("--small", default=1000, show_default=True, help="Tasks of the smaller run.")
@click.option("--admin-url", default="postgresql://postgres@127.0.0.1:5499/postgres",
              show_default=True, help="A cluster of its own with pg_stat_statements preloaded.")
@click.option("--producers", default=2, show_default=True)
@click.option("--producer-threads", default=1, show_default=True)
@click.option("--redis-db", default=11, show_default=True)
@click.option("--counter-db", default=12, show_default=True)
@click.option("--e2e", is_flag=True,
              help="Producers and worker together (the benchmark's throughput phase): what a "
                   "poll and an ack cost then depends on the machine's timing. Default: the "
                   "producers alone, then the worker alone on what they queued.")
@click.option("--output", default="", help="Write the JSON results here.")
def main(variants: str, tasks: int, small: int, admin_url: str, producers: int,
         producer_threads: int, redis_db: int, counter_db: int, e2e: bool,
         output: str) -> None:
    """Statements, transactions, rows, index entries and WAL per Celery task, per variant."""
    cfg = cel.Settings.build(False, producers=producers, admin_url=admin_url,
                            redis_db=redis_db, counter_db=counter_db,
                            producer_threads=producer_threads)
    results: dict[str, Any] = {}
    try:
        for name in variants.split(","):
            for step, got in account(name, cfg, small, tasks, e2e).items():
                results[f"{name}, {step}"] = got
    finally:
        cel.kill_all()
        cel.cleanup_counters(cfg)
    if output:
        Path(output).write_text(json.dumps(results, indent=1))
    console.print(tables(results), markup=False, emoji=False, highlight=False)


if __name__ == "__main__":
    main()
