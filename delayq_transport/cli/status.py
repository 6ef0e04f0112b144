"""``delayq status``: queue counters and what threatens the queue, as a table or as JSON.

Counts are bounded (exact up to a cap, labelled beyond it: ``core/queue/counts.py``) and the health
section reads only catalogs (``core/inspect/health.py``), so the command answers in well under a
second on a table of 10M rows. ``--exact`` restores the full count when that is what you want.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..browse.controls import QueueControls
from ..core.inspect import Health, check_health
from ..core.queue import AT_LEAST, COUNT_CAP, ESTIMATE, DelayedQueue, KindStatus, from_ms
from ..formats.celery import queue_of_kind
from ..output import json_option

LEVEL_STYLE = {"warning": "yellow", "critical": "bold red"}


def _count(value: int, accuracy: str) -> str:
    if accuracy == AT_LEAST:
        return f"≥{value}"
    return f"~{value}" if accuracy == ESTIMATE else str(value)


def _ms_ago(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}s"


def _when(ms: int | None) -> str:
    return "-" if ms is None else from_ms(ms).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f}s"


def _mib(n: int) -> str:
    return f"{n / 1024**2:.1f} MiB"


def status_document(table: str, rows: list[KindStatus], health: Health, cap: int | None,
                    controls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What ``--json`` prints: stable keys, seconds for durations, ISO-8601 UTC for instants."""
    queues = []
    for r in rows:
        queue, priority = queue_of_kind(r.kind)
        queues.append({
            "kind": r.kind, "queue": queue, "priority": priority,
            "due": r.due, "due_accuracy": r.due_accuracy,
            "scheduled": r.scheduled, "scheduled_accuracy": r.scheduled_accuracy,
            "in_flight": r.in_flight, "redelivered": r.redelivered,
            "oldest_due_age_s": None if r.oldest_due_lag_ms is None else r.oldest_due_lag_ms / 1000,
            "next_due_at": None if r.next_due_at is None else r.next_due_at.isoformat(),
        })
    return {"table": table, "at": datetime.now(UTC).isoformat(), "count_cap": cap,
            "queues": queues, "controls": controls or [], "health": health.as_dict()}


def print_queues(console: Console, table: str, rows: list[KindStatus]) -> None:
    view = Table(title=f"{table} at {datetime.now(UTC):%H:%M:%S} UTC")
    for col in ("kind", "due", "scheduled", "in flight", "redelivered", "oldest due lag",
                "next due"):
        view.add_column(col, justify="left" if col in ("kind", "next due") else "right")
    for r in rows:
        view.add_row(r.kind.replace("\x06\x16", " prio "), _count(r.due, r.due_accuracy),
                     _count(r.scheduled, r.scheduled_accuracy), str(r.in_flight),
                     str(r.redelivered), _ms_ago(r.oldest_due_lag_ms), _when(r.next_due_at_ms))
    if not rows:
        view.add_row("(empty)", "0", "0", "0", "0", "-", "-")
    console.print(view)
    if any(r.due_accuracy != "exact" or r.scheduled_accuracy != "exact" for r in rows):
        console.print("[dim]≥N: counted up to the cap, there are more; ~N: estimate from "
                      "PostgreSQL's statistics (--exact counts every row)[/dim]")


def controls_table(rows: list[dict[str, Any]]) -> Table:
    """Paused and limited queues (``delayq queues list``, ``delayq status``)."""
    view = Table("queue", "paused", "concurrency", "in use", "rate", "tokens",
                 "per key: concurrency", "per key: rate", "keys in use",
                 title="paused and limited queues (docs/how-to/limits.md)")
    for r in rows:
        view.add_row(r["queue"], "yes" if r["paused"] else "no", _dash(r["concurrency"]),
                     str(r["in_use"]), _dash(r["rate"]), _dash(r["tokens"]),
                     _dash(r["key_concurrency"]), _dash(r["key_rate"]), str(r["keys_in_use"]))
    return view


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def print_health(console: Console, health: Health) -> None:
    blockers = Table(title="holding back cleanup (oldest first)")
    for col in ("source", "pid", "application", "role", "database", "state", "age", "xid age"):
        blockers.add_column(col, justify="right" if col in ("pid", "age", "xid age") else "left")
    for b in health.blockers:
        blockers.add_row(b.source, str(b.pid or "-"), b.application or "-", b.role or "-",
                         b.database or "-", b.state or "-", _age(b.age_s),
                         str(b.xmin_age_xids or "-"))
    if not health.blockers:
        blockers.add_row("(none)", "-", "-", "-", "-", "-", "-", "-")
    console.print(blockers)
    sizes = Table(title=(f"table and indexes: {health.live_tuples} live, {health.dead_tuples} "
                         f"dead tuples; last vacuum {_age(health.since_vacuum_s)} ago, "
                         f"last analyze {_age(health.since_analyze_s)} ago"))
    for col in ("relation", "kind", "size", "est. bloat"):
        sizes.add_column(col, justify="left" if col in ("relation", "kind") else "right")
    for rel in health.relations:
        bloat = "-" if rel.bloat_ratio is None else f"~{rel.bloat_ratio:.0%}"
        sizes.add_row(rel.name, rel.kind, _mib(rel.bytes), bloat)
    console.print(sizes)
    for w in health.warnings:
        style = LEVEL_STYLE.get(w.level, "yellow")
        console.print(f"[{style}]{w.level}: {w.subject}: {w.message}[/{style}]")
    if not health.warnings:
        console.print("[green]no warnings[/green]")


def run_status(console: Console, queue: DelayedQueue, table: str, *, as_json: bool, exact: bool,
               cap: int, hooks: list[Callable[[Any], None]], obj: Any) -> None:
    rows = queue.status(exact=exact, cap=cap)
    health = check_health(queue.db, table)
    controls = [v.as_dict() for v in QueueControls(queue).list()]
    if as_json:
        doc = status_document(table, rows, health, None if exact else cap, controls)
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return
    print_queues(console, table, rows)
    if controls:
        console.print(controls_table(controls))
    for hook in hooks:
        hook(obj)
    print_health(console, health)


def status_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--cap", type=click.IntRange(min=1), default=COUNT_CAP, show_default=True,
                     help="Most rows each count reads before it is labelled ≥cap or ~estimate")(f)
    f = click.option("--exact", is_flag=True,
                     help="Count every row (a full scan: seconds at millions of rows)")(f)
    return json_option(f)
