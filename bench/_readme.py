"""README's comparison table, rendered from the same results files as docs/benchmarks.md.

``python bench/render_docs.py`` rewrites it between README's ``<!-- readme:start -->`` and
``<!-- readme:end -->`` markers (``--check`` fails when it differs), so the README never
states a figure that the benchmarks page does not hold.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any

from _common import (
    markdown_table,
    prose,
    spread,
    times,
)

#: The results files the table reads.
SOURCES = ("celery", "dramatiq", "scale")


def _celery(data: dict[str, Any], broker: str, *path: str) -> Any:
    value: Any = data.get("results", {}).get(broker, {})
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _rate(value: Any) -> str:
    return "" if value is None else f"{value:,.0f}"


def _latency(data: dict[str, Any], broker: str) -> str:
    pick = _celery(data, broker, "latency", "immediate", "p99_ms")
    late = _celery(data, broker, "latency", "countdown", "p99_ms")
    return "" if pick is None or late is None else f"{pick:.1f} / {late:.1f}"


def _rss(data: dict[str, Any], broker: str) -> str:
    idle, after = (_celery(data, broker, "rss", k) for k in ("idle_mb", "after_mb"))
    return "" if idle is None or after is None else f"{idle:,.0f} → {after:,.0f}"


def _dramatiq(data: dict[str, Any], broker: str) -> str:
    """The median of the rounds with their spread, never the best run (issue 37's decision)."""
    rounds = data.get("end_to_end", {}).get(broker)
    return spread(statistics.median(rounds), min(rounds), max(rounds), "{:,.0f}") \
        if rounds else ""


def _guarantees(celery: dict[str, Any]) -> str:
    """Both one-thread ratios against RabbitMQ and the guarantee that separates them (issue
    37's decision: the targets are accepted as measured, and the README states both)."""
    rates = {b: _celery(celery, b, "throughput", "tasks_per_s")
             for b in ("delayq", "amqp", "delayq_durable", "amqp_confirm")}
    if None in rates.values():
        return ""
    plain = rates["delayq"] / rates["amqp"]
    durable = rates["delayq_durable"] / rates["amqp_confirm"]
    return f"""With one-thread producers, delayq's Celery end to end is {times(plain)} RabbitMQ's
without publisher confirms and {times(durable)} with them (`durable_publish` against confirms).
The two pairs differ in what a returned publish survives: by default a publish returns once
committed, before PostgreSQL flushes it to disk, so a PostgreSQL crash can lose the publishes of
its last ~0.6 s (as RabbitMQ without confirms, or Redis' default persistence, can lose theirs);
with `durable_publish` a returned publish survives a crash, as a confirmed one does on
RabbitMQ."""


def _revision(data: dict[str, Any]) -> str:
    when = data.get("finished_at")
    day = datetime.fromisoformat(when).strftime("%Y-%m-%d") if when else "date not recorded"
    return f"revision {data.get('revision') or 'not recorded'}, {day}"


def section(results: dict[str, dict[str, Any]]) -> str:
    celery, dramatiq, scale = (results.get(name, {}) for name in SOURCES)
    brokers = ("delayq", "redis", "amqp")
    rows = [
        ["Celery end to end, tasks/s",
         *(_rate(_celery(celery, b, "throughput", "tasks_per_s")) for b in brokers)],
        ["Celery end to end, producers publishing from 8 threads, tasks/s",
         *(_rate(_celery(celery, b, "throughput_threads", "tasks_per_s")) for b in brokers)],
        ["Celery, `durable_publish` against RabbitMQ with publisher confirms, tasks/s",
         _rate(_celery(celery, "delayq_durable", "throughput", "tasks_per_s")), "",
         _rate(_celery(celery, "amqp_confirm", "throughput", "tasks_per_s"))],
        ["Celery worker alone draining 10,000 queued tasks, tasks/s",
         *(_rate(_celery(celery, b, "drain", "tasks_per_s")) for b in brokers)],
        ["pick-up p99 / countdown lateness p99, ms", *(_latency(celery, b) for b in brokers)],
        ["worker RSS idle → holding 100,000 one-hour countdowns, MB",
         *(_rss(celery, b) for b in brokers)],
        ["Dramatiq end to end, msgs/s",
         *(_dramatiq(dramatiq, b) for b in ("delayq", "redis", "rabbitmq"))],
    ]
    biggest = max(scale.get("sizes", {}).get("delayq", []), key=lambda s: s["far_rows"],
                  default=None)
    runs = {_revision(celery), _revision(dramatiq)}
    when = (f"Celery and Dramatiq at {_revision(celery)}" if len(runs) == 1 else
            f"Celery at {_revision(celery)}, Dramatiq at {_revision(dramatiq)}")
    drain = "" if biggest is None else (
        f" A drain with {biggest['far_rows']:,} far-future rows waiting took "
        f"{times(biggest['ratio'])} the time of one with 10,000 ({_revision(scale)}).")
    table = markdown_table(("", "delayq", "Redis", "RabbitMQ"), rows, "lrrr")
    text = prose(f"""No-op tasks on a 2-core VM where producers, worker and broker share the
cores; medians of interleaved rounds; {when}.{drain} Commands, machines and every other figure:
[docs/benchmarks.md](docs/benchmarks.md). Dramatiq: the median of the rounds, their range in
brackets.""")
    guarantees = _guarantees(celery)
    return f"{text}\n\n{table}" + (f"\n\n{prose(guarantees)}" if guarantees else "")
