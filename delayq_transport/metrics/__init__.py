"""Prometheus metrics of a delayq queue table, for autoscaling and alerts.

:class:`DelayqCollector` reads the queue's counters and health on every scrape (bounded counts
and catalogs only, so a scrape stays cheap on a table of 10M rows). Serve them with
``delayq metrics --serve`` or from a Celery worker with :func:`install_celery_metrics`; metric
names are in docs/reference/metrics.md, alert rules in docs/how-to/monitor.md.
"""

from __future__ import annotations

from .collector import METRIC_NAMES, METRICS, DelayqCollector, render
from .server import MetricsServer, install_celery_metrics, serve_metrics

__all__ = [
    "METRICS",
    "METRIC_NAMES",
    "DelayqCollector",
    "MetricsServer",
    "install_celery_metrics",
    "render",
    "serve_metrics",
]
