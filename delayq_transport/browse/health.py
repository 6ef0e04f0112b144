"""Is the queue healthy? A verdict for monitoring (``manage.py delayq_health``'s exit status),
from bounded reads only, so it may run every few seconds against a table of millions of rows.

Each :class:`Check` passes or fails with one line saying why:

* ``tables``: delayq's tables exist and carry every migration (read-only);
* ``backlog``: the oldest due task of the watched kinds has waited at most ``max_due_age_s``
  (no worker takes them, or too few: the one figure that says "tasks are not running");
* ``failures``: at most ``max_failed`` django.tasks tasks failed for good within
  ``window_s`` (off unless asked);
* ``database``: nothing holds back the table's cleanup critically (a transaction open for
  an hour, a forgotten replication slot: docs/how-to/monitor.md's thresholds); its warnings
  fail the check only when ``strict``.

The database unreachable is a failed check too: a monitor must hear about it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core import DatabaseUnavailable, DelayedQueue, DelayqError, SchemaMissing, TaskResults
from ..core.inspect import check_health
from ..core.queue import AT_LEAST
from ..core.schema import require_schema
from ..formats.django_tasks import KIND_PREFIX

#: Each count of the backlog check reads at most this many rows (the figure says "≥").
BACKLOG_CAP = 10_000


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Limits:
    """What a healthy queue stays within (None: not checked)."""

    max_due_age_s: float | None = 300.0
    max_failed: int | None = None
    window_s: float = 3600.0
    strict: bool = False


def run_checks(queue: DelayedQueue, watched: Callable[[str], bool], limits: Limits,
               migrate_hint: str) -> list[Check]:
    """Every check, in order; the first that cannot reach the database ends the list."""
    try:
        require_schema(queue.db, queue.table)
    except SchemaMissing as exc:
        return [Check("tables", False, f"{exc} ({migrate_hint})")]
    except DatabaseUnavailable as exc:
        return [Check("database", False, f"unreachable: {exc}")]
    checks = [Check("tables", True, f"{queue.table} and its companions are current")]
    try:
        checks.append(_backlog(queue, watched, limits))
        if limits.max_failed is not None:
            checks.append(_failures(queue, limits))
        checks.append(_database(queue, limits))
    except DelayqError as exc:
        checks.append(Check("database", False, f"a read failed: {exc}"))
    return checks


def _backlog(queue: DelayedQueue, watched: Callable[[str], bool], limits: Limits) -> Check:
    rows = [r for r in queue.status(cap=BACKLOG_CAP) if watched(r.kind)]
    due = sum(r.due for r in rows)
    at_least = any(r.due_accuracy == AT_LEAST for r in rows)
    lag_ms = max((r.oldest_due_lag_ms or 0 for r in rows if r.due), default=0)
    figures = {"due": due, "due_at_least": at_least, "oldest_due_age_s": lag_ms / 1000,
               "kinds": len(rows)}
    shown = f"{'≥' if at_least else ''}{due} due, the oldest waiting {lag_ms / 1000:.1f} s"
    if limits.max_due_age_s is not None and lag_ms > limits.max_due_age_s * 1000:
        return Check("backlog", False, f"{shown}: over {limits.max_due_age_s:g} s (are the "
                                       "workers running, and enough of them?)", figures)
    return Check("backlog", True, shown, figures)


def _failures(queue: DelayedQueue, limits: Limits) -> Check:
    assert limits.max_failed is not None
    results = TaskResults(queue, KIND_PREFIX)
    since = (queue.clock_ms() or _db_now_ms(queue)) - int(limits.window_s * 1000)
    failed = results.failed_since(since, limits.max_failed + 1)
    shown = f"{failed}{'+' if failed > limits.max_failed else ''} failed in the last " \
            f"{limits.window_s:g} s"
    ok = failed <= limits.max_failed
    return Check("failures", ok, shown if ok else f"{shown}: over {limits.max_failed}",
                 {"failed": failed})


def _db_now_ms(queue: DelayedQueue) -> int:
    return int(queue.now().timestamp() * 1000)


def _database(queue: DelayedQueue, limits: Limits) -> Check:
    health = check_health(queue.db, queue.table)
    bad = [w for w in health.warnings if w.level == "critical" or limits.strict]
    lines = [f"{w.level}: {w.subject}: {w.message}" for w in health.warnings]
    figures = {"horizon_age_s": health.horizon_age_s, "dead_tuples": health.dead_tuples,
               "warnings": lines}
    if bad:
        return Check("database", False, "; ".join(lines), figures)
    return Check("database", True, "; ".join(lines) or "no warning", figures)
