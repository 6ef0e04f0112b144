"""The collector: one scrape = one bounded ``status`` and one catalog health read."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from ..core.inspect import Health, check_health
from ..core.queue import COUNT_CAP, ControlUse, DelayedQueue, KindStatus, controls_use
from ..formats.celery import queue_of_kind
from ..formats.deadletters import describe

log = logging.getLogger(__name__)

_TABLE = ("table",)
_QUEUE = ("table", "queue", "priority")
_RELATION = ("table", "relation", "kind")
_CONTROL = ("table", "queue")

#: Every metric: name -> (labels, help). The collector builds each gauge from its entry, so a
#: series cannot be emitted without being declared here; docs/reference/metrics.md is
#: rendered from it. ``queue`` and ``priority`` are the kombu queue and its priority bucket.
METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "delayq_up": (_TABLE, "1 if the last scrape could read the database, else 0"),
    "delayq_scrape_duration_seconds": (_TABLE, "Time the last scrape took"),
    "delayq_count_cap": (_TABLE, "Most rows one count reads; a ready count equal to it means "
                                 "at least"),
    "delayq_ready_messages": (_QUEUE, "Due rows waiting for a worker (kombu's message_count), "
                                      "capped"),
    "delayq_scheduled_messages": (_QUEUE, "Rows due later (exact below the cap, an estimate "
                                          "above)"),
    "delayq_in_flight_messages": (_QUEUE, "Rows delivered to a worker under a live lease"),
    "delayq_redelivered_messages": (_QUEUE, "Waiting rows that were delivered before (lease "
                                            "lapsed, released or rejected)"),
    "delayq_oldest_ready_age_seconds": (_QUEUE, "How long the oldest due row has waited "
                                                "(0: none)"),
    "delayq_dead_letters": (("table", "front_end", "queue"), "Dead letters kept (every front "
                            "end's: docs/how-to/manage-tasks.md#dead-letters), capped"),
    "delayq_live_tuples": (_TABLE, "Live rows of the queue table (cumulative statistics)"),
    "delayq_dead_tuples": (_TABLE, "Dead rows of the queue table not yet vacuumed"),
    "delayq_relation_size_bytes": (_RELATION, "Size of the queue table and of each index"),
    "delayq_relation_bloat_ratio": (_RELATION, "Estimated free or dead share of a relation "
                                               "(pg_stats based)"),
    "delayq_xmin_horizon_age_seconds": (_TABLE, "Age of the oldest transaction or snapshot "
                                                "holding back cleanup (0: none)"),
    "delayq_xmin_horizon_age_xids": (_TABLE, "Transaction ids the oldest horizon holder is "
                                             "behind"),
    "delayq_idle_in_transaction_sessions": (_TABLE, "Sessions idle in transaction for over a "
                                                    "second"),
    "delayq_idle_in_transaction_max_age_seconds": (_TABLE, "Longest idle-in-transaction "
                                                           "session"),
    "delayq_cleanup_blockers": (("table", "source"), "Holders of the xmin horizon by source "
                                "(session, standby, replication_slot, prepared_transaction)"),
    "delayq_warnings": (("table", "level"), "Warnings `delayq status` shows, by level"),
    "delayq_queue_paused": (_CONTROL, "1 if the queue is paused fleet-wide (docs/how-to/"
                                      "limits.md), 0 if limited only"),
    "delayq_queue_concurrency_limit": (_CONTROL, "Most tasks of the queue held at once"),
    "delayq_queue_in_use": (_CONTROL, "Tasks of a controlled queue held now (running or "
                                      "prefetched)"),
    "delayq_queue_rate_limit_per_second": (_CONTROL, "Claims per second the queue's rate "
                                                     "limit allows"),
    "delayq_queue_rate_tokens": (_CONTROL, "Claims the queue's token bucket allows now"),
}
#: name -> help text (kept for callers of the earlier API).
METRIC_NAMES: dict[str, str] = {name: text for name, (_, text) in METRICS.items()}


def _gauge(name: str) -> GaugeMetricFamily:
    labels, text = METRICS[name]
    return GaugeMetricFamily(name, text, labels=list(labels))


class DelayqCollector:
    """A prometheus_client collector over one queue table (register it in any registry)."""

    def __init__(self, queue: DelayedQueue, *, cap: int = COUNT_CAP) -> None:
        self.queue = queue
        self.cap = cap

    def describe(self) -> list[Metric]:
        return []  # registering must not query the database

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        table = self.queue.table
        try:
            rows = self.queue.status(cap=self.cap)
            health = check_health(self.queue.db, table)
            controls = controls_use(self.queue)
            up = 1.0
        except Exception as exc:  # a scrape reports failure as delayq_up 0, never raises
            log.warning("delayq metrics: scrape of %s failed: %s", table, exc)
            rows, health, controls, up = [], None, [], 0.0
        yield from self._queue_metrics(table, rows)
        yield from self._control_metrics(table, controls)
        if health is not None:
            yield from self._health_metrics(table, health)
        for name, value in (("delayq_up", up),
                            ("delayq_scrape_duration_seconds", time.perf_counter() - started),
                            ("delayq_count_cap", float(self.cap))):
            g = _gauge(name)
            g.add_metric([table], value)
            yield g

    def _queue_metrics(self, table: str, rows: list[KindStatus]) -> Iterator[Metric]:
        fields = {
            "delayq_ready_messages": lambda r: r.due,
            "delayq_scheduled_messages": lambda r: r.scheduled,
            "delayq_in_flight_messages": lambda r: r.in_flight,
            "delayq_redelivered_messages": lambda r: r.redelivered,
            "delayq_oldest_ready_age_seconds": lambda r: (r.oldest_due_lag_ms or 0) / 1000,
        }
        waiting = [r for r in rows if describe(r.kind) is None]
        for name, get in fields.items():
            g = _gauge(name)
            for r in waiting:
                queue, priority = queue_of_kind(r.kind)
                g.add_metric([table, queue, str(priority)], float(get(r)))
            yield g
        dead = _gauge("delayq_dead_letters")
        for r in rows:
            described = describe(r.kind)
            if described is not None:
                dead.add_metric([table, described.front_end, described.queue],
                                float(r.due + r.scheduled + r.in_flight))
        yield dead

    def _control_metrics(self, table: str, controls: list[ControlUse]) -> Iterator[Metric]:
        fields = {
            "delayq_queue_paused": lambda u: float(u.control.paused),
            "delayq_queue_concurrency_limit": lambda u: u.control.concurrency,
            "delayq_queue_in_use": lambda u: float(u.in_use),
            "delayq_queue_rate_limit_per_second": lambda u: (
                None if u.control.rate is None else u.control.rate[0] * 1000 / u.control.rate[1]),
            "delayq_queue_rate_tokens": lambda u: u.tokens,
        }
        for name, get in fields.items():
            g = _gauge(name)
            for u in controls:
                value = get(u)
                if value is not None:
                    g.add_metric([table, u.control.name], float(value))
            yield g

    def _health_metrics(self, table: str, health: Health) -> Iterator[Metric]:
        idle = [b.age_s or 0.0 for b in health.blockers if b.idle_in_transaction]
        for name, value in (
            ("delayq_live_tuples", health.live_tuples or 0),
            ("delayq_dead_tuples", health.dead_tuples or 0),
            ("delayq_xmin_horizon_age_seconds", health.horizon_age_s),
            ("delayq_xmin_horizon_age_xids", health.horizon_age_xids),
            ("delayq_idle_in_transaction_sessions", len(idle)),
            ("delayq_idle_in_transaction_max_age_seconds", max(idle, default=0.0)),
        ):
            g = _gauge(name)
            g.add_metric([table], float(value))
            yield g
        size = _gauge("delayq_relation_size_bytes")
        bloat = _gauge("delayq_relation_bloat_ratio")
        for rel in health.relations:
            size.add_metric([table, rel.name, rel.kind], float(rel.bytes))
            if rel.bloat_ratio is not None:
                bloat.add_metric([table, rel.name, rel.kind], rel.bloat_ratio)
        yield size
        yield bloat
        blockers = _gauge("delayq_cleanup_blockers")
        for source in ("session", "standby", "replication_slot", "prepared_transaction"):
            n = sum(1 for b in health.blockers if b.source == source)
            blockers.add_metric([table, source], float(n))
        yield blockers
        warnings = _gauge("delayq_warnings")
        for level in ("warning", "critical"):
            warnings.add_metric([table, level],
                                float(sum(1 for w in health.warnings if w.level == level)))
        yield warnings


def render(queue: DelayedQueue, *, cap: int = COUNT_CAP) -> bytes:
    """One scrape in the Prometheus text format (``delayq metrics`` without ``--serve``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DelayqCollector(queue, cap=cap))
    return generate_latest(registry)
