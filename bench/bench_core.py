"""Queue-core benchmark: DelayedQueue next to the raw SQL doing the same work (issue 2).

Four operations, each measured through delayq's public API and as the plainest psycopg 3 code
that does the same work on one connection against the same ``delayed_queue`` table (created by
``migrate``, triggers included) — the reference delayq's overhead is measured against:

- ``offer`` one message per call / single-row ``INSERT ... ON CONFLICT DO NOTHING``;
- ``offer_batch`` (chunks of 1000) / multi-row insert from ``unnest`` arrays;
- ``try_poll`` + ``Envelope.ack`` / ``UPDATE ... SKIP LOCKED LIMIT 1 RETURNING`` + ``DELETE``;
- ``try_poll_many(100)`` + ``ack_many`` / the 100-row version + one batched ``DELETE``.

Every phase starts from a truncated (and, for polls, freshly filled and vacuumed) table, warms
up untimed, then runs for at least ``--seconds`` of measured time. Rounds alternate which side
goes first; the reported figure is the median of the rounds. Writes
``bench/results/core.json``, the "Queue core" section of ``docs/benchmarks.md`` and
``docs/img/bench_core.png``.
"""

from __future__ import annotations

import itertools
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import psycopg
from _common import (
    IMG_DIR,
    TargetRow,
    command_line,
    console,
    database_url_option,
    fmt_rate,
    fresh_database,
    git_revision,
    grouped_bar_chart,
    machine_info,
    markdown_table,
    percent,
    progress_bar,
    prose,
    run_line,
    vacuum_analyze,
    verdict,
    write_results,
)
from _core_meter import (
    Exhausted,
    Meter,
    Series,
    Workload,
    measure_interleaved,
    paired_ratio,
    reporter,
    timed_task,
)
from _targets import replace_section
from psycopg import sql
from rich.progress import Progress

from delayq_transport import Database, DelayedQueue, Offer, OfferOutcome, migrate

TABLE = "delayed_queue"
KIND = "bench"
PAYLOAD_BYTES = 200
BATCH_CHUNK = 1000
POLL_BATCH = 100
LEASE_MS = 60_000
#: Offered messages are due an hour from now: a delayed queue's normal case.
OFFER_DELAY = timedelta(hours=1)
CHART = IMG_DIR / "bench_core.png"

#: The baseline, deliberately not delayq's queue.sql: the least SQL that does each job on
#: the same table, values bound, arrays sent in binary. psycopg prepares each statement after
#: five executions, as it does for delayq's.
_NOW_MS = "(extract(epoch FROM now()) * 1000)::bigint"
RAW_SQL = {
    "insert_one": f"""
        INSERT INTO {{table}} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially",
                               "createdAt")
        VALUES (%(key)s, %(kind)s, %(payload)s, %(at)s, %(at)s, {_NOW_MS})
        ON CONFLICT ("pKey", "pKind") DO NOTHING""",
    "insert_many": f"""
        INSERT INTO {{table}} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially",
                               "createdAt")
        SELECT s.key, %(kind)s, s.payload, s.at, s.at, {_NOW_MS}
        FROM unnest(%(keys)b::text[], %(payloads)b::bytea[], %(ats)b::bigint[])
             AS s(key, payload, at)
        ON CONFLICT ("pKey", "pKind") DO NOTHING""",
    "acquire": f"""
        UPDATE {{table}}
        SET "lockUuid" = %(lock)s, "scheduledAt" = {_NOW_MS} + %(lease_ms)s
        WHERE "id" IN (
            SELECT "id" FROM {{table}}
            WHERE "pKind" = %(kind)s AND "scheduledAt" <= {_NOW_MS}
            ORDER BY "scheduledAt"
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED)
        RETURNING "id", "pKey", "pKind", "payload", "scheduledAtInitially", "createdAt",
                  "lockUuid\"""",
    "delete_one": 'DELETE FROM {table} WHERE "id" = %(id)s',
    "delete_many": 'DELETE FROM {table} WHERE "id" = ANY(%(ids)b::bigint[])',
    "truncate": "TRUNCATE {table} RESTART IDENTITY",
}


def raw_statements(table: str) -> dict[str, str]:
    ident = sql.Identifier(table)
    return {k: sql.SQL(v).format(table=ident).as_string(None) for k, v in RAW_SQL.items()}


@dataclass(frozen=True)
class Settings:
    seconds: float
    warmup_seconds: float
    slice_seconds: float
    rounds: int
    batch_messages: int

    @classmethod
    def for_run(cls, quick: bool, seconds: float | None, rounds: int | None) -> Settings:
        if quick:
            return cls(seconds or 0.5, 0.1, 0.1, rounds or 1, 10_000)
        return cls(seconds or 3.0, 0.5, 0.25, rounds or 3, 100_000)


@dataclass(frozen=True)
class Target:
    """``rate``: delayq msgs/s at least ``value``; ``ratio``: delayq/raw at least ``value``."""

    kind: str
    value: float

    def met(self, delayq_rate: float, ratio: float) -> bool:
        return (delayq_rate if self.kind == "rate" else ratio) >= self.value

    def describe(self) -> str:
        if self.kind == "rate":
            return f"≥ {self.value:,.0f} msgs/s"
        return f"≥ {self.value:.0%} of raw"


@dataclass
class Operation:
    id: str
    label: str
    target: Target
    setup: Callable[[], None]
    refill: Callable[[], None] | None
    sides: dict[str, Workload]
    results: dict[str, Series] = field(default_factory=dict)

    def ratio(self) -> float:
        """delayq/raw as the median of per-round ratios (each round ran both interleaved)."""
        return paired_ratio(self.results["delayq"], self.results["raw"])

    def met(self) -> bool:
        return self.target.met(self.results["delayq"].median_rate, self.ratio())


class CoreBench:
    """Holds the queue, the raw connection and the workloads measured against both."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(url, max_size=2)
        migrate(self.db, TABLE)
        self.queue = DelayedQueue(self.db, kind=KIND, table=TABLE, ensure_schema=False,
                                  acquire_timeout=LEASE_MS / 1000)
        self.conn = psycopg.connect(url, autocommit=True)
        self.sql = raw_statements(TABLE)
        self.url = url
        self.payload = random.Random(2).randbytes(PAYLOAD_BYTES)
        self.serial = itertools.count()

    def close(self) -> None:
        self.conn.close()
        self.queue.close()
        self.db.close()

    # -- table state ------------------------------------------------------------------

    def reset(self) -> None:
        self.conn.execute(self.sql["truncate"])

    def fill_due(self, rows: int) -> None:
        """Insert ``rows`` messages already due (untimed set-up for the poll phases)."""
        at = int(time.time() * 1000) - 1000
        for start in range(0, rows, BATCH_CHUNK):
            keys = self.keys(min(BATCH_CHUNK, rows - start))
            self.raw_insert_many(keys, [at] * len(keys))

    def filled(self, rows: int) -> Callable[[], None]:
        def setup() -> None:
            self.reset()
            self.fill_due(rows)
            vacuum_analyze(self.url, TABLE)

        return setup

    def keys(self, n: int) -> list[str]:
        return [f"m{next(self.serial)}" for _ in range(n)]

    def offer_at(self) -> datetime:
        return datetime.now(UTC) + OFFER_DELAY

    # -- raw SQL ----------------------------------------------------------------------

    def raw_insert_many(self, keys: list[str], ats: list[int]) -> int:
        params = {"kind": KIND, "keys": keys, "payloads": [self.payload] * len(keys), "ats": ats}
        return self.conn.execute(self.sql["insert_many"], params).rowcount

    def raw_offer(self, key: str) -> int:
        at = int(self.offer_at().timestamp() * 1000)
        params = {"key": key, "kind": KIND, "payload": self.payload, "at": at}
        if self.conn.execute(self.sql["insert_one"], params).rowcount != 1:
            raise RuntimeError(f"raw insert of fresh key {key!r} created nothing")
        return 1

    def raw_offer_batch(self, keys: list[str]) -> int:
        at = int(self.offer_at().timestamp() * 1000)
        created = 0
        for start in range(0, len(keys), BATCH_CHUNK):
            chunk = keys[start : start + BATCH_CHUNK]
            created += self.raw_insert_many(chunk, [at] * len(chunk))
        return _expect(created, len(keys))

    def raw_poll(self, limit: int) -> int:
        params = {"kind": KIND, "limit": limit, "lease_ms": LEASE_MS, "lock": str(uuid.uuid4())}
        rows = self.conn.execute(self.sql["acquire"], params).fetchall()
        if not rows:
            raise Exhausted
        if limit == 1:
            deleted = self.conn.execute(self.sql["delete_one"], {"id": rows[0][0]}).rowcount
        else:
            ids = [r[0] for r in rows]
            deleted = self.conn.execute(self.sql["delete_many"], {"ids": ids}).rowcount
        return _expect(deleted, len(rows))

    # -- delayq -----------------------------------------------------------------------

    def delayq_offer(self, key: str) -> int:
        if self.queue.offer(key, self.payload, self.offer_at()) is not OfferOutcome.CREATED:
            raise RuntimeError(f"offer of fresh key {key!r} was not CREATED")
        return 1

    def delayq_offer_batch(self, keys: list[str]) -> int:
        at = self.offer_at()
        items = [Offer(k, self.payload, at) for k in keys]
        outcomes = self.queue.offer_batch(items, chunk_size=BATCH_CHUNK)
        return _expect(outcomes.count(OfferOutcome.CREATED), len(keys))

    def delayq_poll_one(self, _: object) -> int:
        envelope = self.queue.try_poll()
        if envelope is None:
            raise Exhausted
        if not envelope.ack():
            raise RuntimeError(f"ack of {envelope.key!r} deleted nothing")
        return 1

    def delayq_poll_many(self, _: object) -> int:
        envelopes = self.queue.try_poll_many(POLL_BATCH)
        if not envelopes:
            raise Exhausted
        return _expect(self.queue.ack_many(envelopes), len(envelopes))

    # -- the four operations ----------------------------------------------------------

    def operations(self) -> list[Operation]:
        s = self.settings
        one_key = lambda: self.keys(1)[0]  # noqa: E731
        batch_keys = lambda: self.keys(s.batch_messages)  # noqa: E731
        single_rows = max(2_000, int(3_000 * (s.seconds + s.warmup_seconds)))
        batch_rows = max(20_000, int(40_000 * (s.seconds + s.warmup_seconds)))
        return [
            Operation(
                "offer", "offer (single)", Target("ratio", 0.70), self.reset, None,
                {"delayq": Workload(self.delayq_offer, one_key),
                 "raw": Workload(self.raw_offer, one_key)},
            ),
            Operation(
                "offer_batch", f"offer_batch ({BATCH_CHUNK}/chunk)", Target("rate", 50_000),
                self.reset, None,
                {"delayq": Workload(self.delayq_offer_batch, batch_keys),
                 "raw": Workload(self.raw_offer_batch, batch_keys)},
            ),
            Operation(
                "poll_ack", "try_poll + ack", Target("ratio", 0.70),
                self.filled(single_rows), lambda: self.fill_due(single_rows),
                {"delayq": Workload(self.delayq_poll_one),
                 "raw": Workload(lambda _: self.raw_poll(1))},
            ),
            Operation(
                "poll_many_ack", f"try_poll_many({POLL_BATCH}) + ack_many",
                Target("rate", 40_000),
                self.filled(batch_rows), lambda: self.fill_due(batch_rows),
                {"delayq": Workload(self.delayq_poll_many),
                 "raw": Workload(lambda _: self.raw_poll(POLL_BATCH))},
            ),
        ]


def _expect(done: int, expected: int) -> int:
    """Count only work that really happened; a silent no-op would inflate the rate."""
    if done != expected:
        raise RuntimeError(f"expected {expected} rows affected, got {done}")
    return done


# -- running --------------------------------------------------------------------------


def run_all(bench: CoreBench) -> list[Operation]:
    """Every operation, every round, both sides interleaved; who goes first alternates."""
    ops = bench.operations()
    s = bench.settings
    with progress_bar() as progress:
        overall = progress.add_task("queue core", total=s.rounds * len(ops), rate="",
                                    unit="phases")
        for rnd in range(s.rounds):
            order = ("delayq", "raw") if rnd % 2 == 0 else ("raw", "delayq")
            for op in ops:
                sample_pair(progress, op, order, rnd, s)
                progress.advance(overall)
    return ops


def sample_pair(progress: Progress, op: Operation, order: tuple[str, str], rnd: int,
                s: Settings) -> None:
    """One round of one operation: fresh table, warm-up of both sides, interleaved timing."""
    tasks = {side: timed_task(progress, f"r{rnd + 1} {op.id:<13} {side:<6}", s.seconds)
             for side in order}
    for task in tasks.values():
        progress.update(task, rate="setting up")
    op.setup()
    for side in order:
        Meter(op.sides[side], refill=op.refill).run_for(s.warmup_seconds)
    meters = {side: Meter(op.sides[side], refill=op.refill,
                          on_progress=reporter(progress, tasks[side])) for side in order}
    samples = measure_interleaved(meters, seconds=s.seconds, slice_seconds=s.slice_seconds)
    for side, sample in samples.items():
        op.results.setdefault(side, Series()).samples.append(sample)


# -- reporting ------------------------------------------------------------------------


def results_json(ops: list[Operation], settings: Settings, info: dict[str, Any],
                 wall_s: float) -> dict[str, Any]:
    return {
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line(),
        "settings": dict(settings.__dict__, payload_bytes=PAYLOAD_BYTES,
                         batch_chunk=BATCH_CHUNK, poll_batch=POLL_BATCH),
        "machine": info,
        "git_revision": git_revision(),
        "wall_seconds": round(wall_s, 1),
        "load_average_at_end": os.getloadavg()[0],
        "raw_sql": {k: " ".join(v.split()) for k, v in RAW_SQL.items()},
        "operations": [
            {
                "id": op.id,
                "label": op.label,
                "delayq": op.results["delayq"].to_json(),
                "raw": op.results["raw"].to_json(),
                "ratio": round(op.ratio(), 3),
                "target": {"kind": op.target.kind, "value": op.target.value,
                           "text": op.target.describe()},
                "met": op.met(),
            }
            for op in ops
        ],
    }


def met(op: dict[str, Any]) -> bool:
    """The target judged on the figure the page shows (bench/_common.py's rounding rule)."""
    target = op["target"]
    if target["kind"] == "rate":
        return round(op["delayq"]["median_per_s"]) >= target["value"]
    return round(op["ratio"] * 100) >= round(target["value"] * 100)


def table_rows(operations: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [op["label"], fmt_rate(op["delayq"]["median_per_s"]), fmt_rate(op["raw"]["median_per_s"]),
         percent(op["ratio"]), op["target"]["text"], verdict(met(op))]
        for op in operations
    ]


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """This run's rows of the page's "Targets at a glance"."""
    return [TargetRow("queue core", f"{op['label']}: {op['target']['text']}",
                      f"{fmt_rate(op['delayq']['median_per_s'])} msgs/s, {percent(op['ratio'])} "
                      f"of raw SQL's {fmt_rate(op['raw']['median_per_s'])}", verdict(met(op)))
            for op in data["operations"]]


def notes(operations: list[dict[str, Any]]) -> list[str]:
    """Plain statements about each missed target, derived from the figures of this run."""
    lines = []
    for op in operations:
        if met(op):
            continue
        dq, raw = op["delayq"]["median_per_s"], op["raw"]["median_per_s"]
        target = op["target"]
        head = f"**{op['label']}** missed {target['text']}: delayq {fmt_rate(dq)} msgs/s"
        if target["kind"] == "rate" and raw < target["value"]:
            lines.append(
                f"{head}, and the raw SQL reached only {fmt_rate(raw)} msgs/s here, so this "
                f"machine cannot meet the target with one Python client thread whatever the "
                f"library does; delayq reached {percent(op['ratio'])} of that limit.")
        elif target["kind"] == "rate":
            lines.append(
                f"{head} while the raw SQL reached {fmt_rate(raw)} msgs/s: delayq's own "
                f"per-message work (it reached {percent(op['ratio'])} of raw) is what misses it.")
        else:
            lines.append(f"{head} against {fmt_rate(raw)} msgs/s for the raw SQL "
                         f"({percent(op['ratio'])}).")
    return lines


def section(data: dict[str, Any]) -> str:
    """The "Queue core" section of docs/benchmarks.md from a results document."""
    m, s, ops = data["machine"], data["settings"], data["operations"]
    load = (m["load_average_at_start"][0], data["load_average_at_end"])
    busy = load[1] > 0.5 * (m["cpu_count"] or 1)
    commit_ms = 1000 / max(ops[0]["raw"]["median_per_s"], 1e-9)
    command = data.get("command", "python bench/bench_core.py")
    how = prose(f"""
`DelayedQueue` next to the least raw SQL doing each job on one connection, same `{TABLE}` table
and triggers, {s['payload_bytes']}-byte payloads; the raw side skips validation, per-item
outcomes, envelopes, the (id, lock) match of acks and the pool. Both sides alternate in
{s['slice_seconds']} s slices until each has {s['seconds']} s of measured time; medians of
{s['rounds']} rounds. Every statement is its own transaction, so a single-message call waits
for one WAL flush ({commit_ms:.2f} ms per commit in this run).""")
    missed = "\n\n".join(prose(n) for n in notes(ops))
    return f"""## Queue core

{run_line(command, data.get("git_revision"), data.get("finished_at"), m, load)}
{BUSY_WARNING if busy else ""}
{markdown_table(TABLE_HEADERS, table_rows(ops), align="lrrrll")}

![Queue core: delayq against raw SQL, msgs/s (log scale)](img/{CHART.name})

{missed + chr(10) + chr(10) if missed else ""}{how}
"""


BUSY_WARNING = "\n" + prose("**A busy machine** (load average above half the cores): the "
                             "absolute rates are low and noisy; compare the ratios.") + "\n"
TABLE_HEADERS = ["Operation", "delayq msgs/s", "raw SQL msgs/s", "delayq/raw", "Target", "Met?"]


def report(ops: list[Operation], data: dict[str, Any], write_docs: bool) -> None:
    print(markdown_table(TABLE_HEADERS, table_rows(data["operations"]), align="lrrrll"))
    if not write_docs:
        return
    grouped_bar_chart(
        CHART, [op.label for op in ops],
        {"delayq": [op.results["delayq"].median_rate for op in ops],
         "raw SQL (reference)": [op.results["raw"].median_rate for op in ops]},
        title="Queue core throughput, one client thread", ylabel="msgs/s (log scale)",
        log_scale=True,
        targets=[op.target.value if op.target.kind == "rate" else None for op in ops],
    )
    path = replace_section("core", section(data))
    console.print(f"wrote {path} and {CHART}")


@click.command()
@database_url_option
@click.option("--quick", is_flag=True, help="Short smoke run (core_quick.json, docs untouched).")
@click.option("--seconds", type=float, help="Measured seconds per sample [3; quick 0.5].")
@click.option("--rounds", type=int, help="Samples per operation and side [3; quick 1].")
@click.option("--docs/--no-docs", "write_docs", default=None,
              help="Rewrite docs/benchmarks.md and the chart [default: unless --quick].")
def main(database_url: str, quick: bool, seconds: float | None, rounds: int | None,
         write_docs: bool | None) -> None:
    """Measure DelayedQueue's hot paths against raw SQL; write results and docs."""
    settings = Settings.for_run(quick, seconds, rounds)
    started = time.perf_counter()
    with fresh_database(database_url, prefix="delayq_bench_core") as url:
        info = machine_info(url)
        bench = CoreBench(url, settings)
        try:
            ops = run_all(bench)
        finally:
            bench.close()
    data = results_json(ops, settings, info, time.perf_counter() - started)
    path = write_results("core_quick" if quick else "core", data)
    console.print(f"wrote {path}")
    report(ops, data, (not quick) if write_docs is None else write_docs)


if __name__ == "__main__":
    main()
