"""docs/benchmarks.md's "Targets at a glance" and "Where delayq is behind", rendered from the
same results files as the sections, by the same writers' rules (each writer's
``targets(data)``), so the table never states a figure its section does not.

``python bench/render_docs.py`` rewrites both between their markers (``targets`` and
``behind``); ``--check`` fails when they differ.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from _common import (
    BENCHMARKS_INTRO,
    BENCHMARKS_MD,
    load_results,
    markdown_table,
    prose,
    revision_cell,
    times,
    with_section,
)

#: Results file -> the writer whose ``targets(data)`` gives its rows, in the table's order.
WRITERS = {
    "core": "bench_core",
    "celery": "_celery_report",
    "beat": "bench_beat",
    "spark": "bench_spark",
    "scale": "bench_scale",
    "scale_snapshot": "_scale_snapshot",
    "churn_churn": "bench_churn",
    "counts": "bench_counts",
    "web": "bench_web",
    "dramatiq": "bench_dramatiq",
}
SOURCES = tuple(WRITERS)


def section(results: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, module in WRITERS.items():
        data = results.get(name)
        if not data:
            continue
        for row in importlib.import_module(module).targets(data):
            rows.append([row.area, row.target, row.measured, revision_cell(data), row.holds])
    table = markdown_table(("area", "target", "latest measurement", "revision, date (UTC)",
                            "holds?"), rows)
    return f"""## Targets at a glance

{table}

\\* with uncommitted changes. Each row comes from its section's results file
(`bench/results/<name>.json`) by the section's own rule; runs of different revisions may come
from different VMs of the same kind, so compare ratios, not rates across rows."""


def _cpu(results: dict[str, Any], broker: str, phase: str, part: str) -> float:
    return float((results.get(broker, {}).get(phase, {}).get("cpu_us_per_task") or {})
                 .get(part) or 0)


def behind(results: dict[str, dict[str, Any]]) -> str:
    """Where delayq is behind RabbitMQ in the Celery run, and why, with this run's figures."""
    celery = results.get("celery", {}).get("results", {})
    rates = {(b, p): celery.get(b, {}).get(p, {}).get("tasks_per_s")
             for b in ("delayq", "amqp", "amqp_confirm")
             for p in ("throughput", "throughput_threads")}
    if not all(rates.values()):
        return "## Where delayq is behind\n\nThe Celery run holds no RabbitMQ figures."

    def ratio(phase: str, base: str = "amqp") -> str:
        return times(rates["delayq", phase] / rates[base, phase])

    def server(phase: str) -> str:
        return (f"{_cpu(celery, 'delayq', phase, 'server_us'):,.0f} + "
                f"{_cpu(celery, 'delayq', phase, 'pg_aux_us'):,.0f} vs RabbitMQ's "
                f"{_cpu(celery, 'amqp', phase, 'server_us'):,.0f} µs")

    producers = {b: _cpu(celery, b, "throughput", "producers_us") for b in ("delayq", "amqp")}
    confirm = sorted([ratio("throughput", "amqp_confirm"),
                      ratio("throughput_threads", "amqp_confirm")])
    threads = results["celery"].get("settings", {}).get("producer_threads", 8)
    return "## Where delayq is behind\n\n" + prose(f"""
End to end against RabbitMQ with the default options, delayq is at {ratio("throughput")} with
producers publishing from one thread each and {ratio("throughput_threads")} from {threads}
threads, on this 2-core machine where producers, worker and broker share the cores. The Celery
section's CPU per task says where: with one-thread producers, producers {producers["delayq"]:,.0f}
vs {producers["amqp"]:,.0f} µs per task and PostgreSQL {server("throughput")}: kombu's virtual
channel, the pool and one statement per publish (its wake-up rides in it) in the producers;
the insert, poll, lease and ack in PostgreSQL. From {threads} threads concurrent publishes share
commits and PostgreSQL's share is {server("throughput_threads")}. Against RabbitMQ with
publisher confirms, the same guarantee as delayq's default (the task stored when `apply_async`
returns), delayq is at {confirm[0]}–{confirm[1]}. Redis answers a countdown a few milliseconds
sooner, because it holds every countdown in the worker's memory.""")


#: The page's sections written from several results files: marker name -> writer.
SUMMARIES = {"targets": section, "behind": behind}


def refresh(text: str) -> str:
    """``text`` (the page) with both summaries rendered from every results file now stored."""
    every = {name: load_results(name) for name in SOURCES}
    for name, writer in SUMMARIES.items():
        text = with_section(text, name, writer(every))
    return text


def replace_section(name: str, body: str, path: Path = BENCHMARKS_MD) -> Path:
    """Rewrite one bench's section of the page in place (the page is created with the shared
    intro when missing)."""
    text = path.read_text() if path.exists() else BENCHMARKS_INTRO
    path.parent.mkdir(parents=True, exist_ok=True)
    text = with_section(text, name, body)
    if path == BENCHMARKS_MD:
        text = refresh(text)  # the targets table reads every results file, this run's included
    path.write_text(text)
    return path
