"""Sections of docs/benchmarks.md from runs that wrote no results file of their own: their
figures were transcribed once into ``bench/results/<name>.json`` (``recorded_by_hand`` says
from what), and are rendered from there like every other section, with the same rounding rule.
"""

from __future__ import annotations

from typing import Any

from _common import markdown_table, prose, times

PGBOUNCER_LABELS = {"delayq": "direct", "delayq_pgbouncer": "PgBouncer (transaction)",
                    "delayq_pgbouncer_listen": "PgBouncer + `listen_url`"}


def _pgbouncer(data: dict[str, Any]) -> str:
    results, s = data["results"], data["settings"]
    direct = results["delayq"]["tasks_per_s"]
    brokers = list(PGBOUNCER_LABELS)

    def rate(broker: str) -> str:
        value = results[broker]["tasks_per_s"]
        return f"{value:,.0f}" if broker == "delayq" else f"{value:,.0f} ({times(value / direct)})"

    def pair(broker: str, kind: str) -> str:
        r = results[broker][kind]
        return f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}"

    table = markdown_table(["", *PGBOUNCER_LABELS.values()], [
        ["no-op end to end, tasks/s", *(rate(b) for b in brokers)],
        ["pick-up latency p50 / p99, ms", *(pair(b, "immediate") for b in brokers)],
        ["countdown lateness p50 / p99, ms", *(pair(b, "countdown") for b in brokers)],
    ], "lrrr")
    return f"""## Celery behind PgBouncer

{prose(f'''`{data["command"]}`, revision {data["revision"]}, {data["finished_at"]},
{data["machine_note"]}; throughput the median of {s["rounds"]} interleaved rounds of
{s["throughput_n"]:,} no-op tasks from {s["producers"]} producer processes, latency
{s["latency_samples"]} samples. Recorded by hand ({data["recorded_by_hand"]}).''')}

{table}

{prose(f'''Every transaction costs two round trips more through the pooler (`BEGIN; SET LOCAL`
and `COMMIT`). Without `listen_url` a task published for now is found by the next poll, every
`unheard_polling_interval` ({s["unheard_polling_interval_s"]:g} s); countdowns keep their time
because a poll already saw them.''')}
"""


def _short(rows: int) -> str:
    return f"{rows // 1_000_000}M" if rows >= 1_000_000 else f"{rows:,}"


def _scale_10m(data: dict[str, Any]) -> str:
    s = data["settings"]
    low, high = data["pickup_p99_ms_range"]
    load = data["load_average"]
    ratios = ", ".join(f"{times(r['ratio'])} at {_short(r['far_rows'])}" for r in data["sizes"])
    largest = max(r["far_rows"] for r in data["sizes"])
    return f"""## Celery at scale: {largest:,} rows

{prose(f'''`{data["command"]}`, revision {data["revision"]}, {data["finished_at"]}
({data["date_note"]}), load average {load[0]:g} → {load[1]:g}: the drain of
{s["drain_tasks"]:,} no-ops next to a {s["reference_rows"]:,}-row reference, {s["rounds"]}
rounds, median over median: {ratios} far-future rows; pick-up p99 {low:g}-{high:g} ms at every
size. Recorded by hand ({data["recorded_by_hand"]}).''')}
"""


def _task_account(data: dict[str, Any]) -> str:
    pub, con, s = data["publish"], data["consume"], data["settings"]
    table = markdown_table(["per task", "publish (`apply_async`)", "consume (poll, lease, ack)"], [
        ["statements (round trips) and transactions", f"{pub['statements']} (its wake-up rides in "
         "it)", f"~{con['statements']:g}: a poll per ~{con['rows_per_poll']} rows, an ack per "
         f"~{con['rows_per_ack']}"],
        ["heap rows", pub["heap"], con["heap"]],
        ["index entries written", pub["index_entries"], con["index_entries"]],
        ["WAL", f"~{pub['wal_kb']:g} KB in ~{pub['wal_records']} records",
         f"~{con['wal_kb']:g} KB in ~{con['wal_records']} records"],
    ], "lll")
    wal_kb = pub["wal_kb"] + con["wal_kb"]
    rate = data["example_rate_per_s"]
    per_s_mb = wal_kb * rate / 1000
    return f"""## Cost per task

{prose(f'''`{data["command"]}`, revision {data["revision"]}, {data["finished_at"]}: producers
alone, then the worker alone, no-op tasks, `worker_prefetch_multiplier`
{s["worker_prefetch_multiplier"]} with `-c {s["concurrency"]}`; the difference of two runs, so
start-up is left out. Recorded by hand ({data["recorded_by_hand"]}).''')}

{table}

{prose(f'''WAL: ~{wal_kb:.1f} KB per task, so {rate:,} tasks/s write ~{per_s_mb:.1f} MB/s
(~{per_s_mb * 3600 / 1000:.0f} GB/h). What a task costs PostgreSQL does not depend on the machine;
its CPU per task does: the *broker server (+ PG WAL writer etc.)* figure of the [Celery
broker](#celery-broker) section.''')}
"""


def section(data: dict[str, Any]) -> str:
    return {"celery_pgbouncer": _pgbouncer, "scale_10m": _scale_10m,
            "task_account": _task_account}[data["benchmark"]](data)
