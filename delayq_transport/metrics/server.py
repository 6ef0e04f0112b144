"""Serving the metrics over HTTP: standalone (``delayq metrics --serve``) or inside a worker."""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from ..core.db import Database
from ..core.queue import COUNT_CAP, DelayedQueue
from ..core.schema import require_schema
from .collector import DelayqCollector

log = logging.getLogger(__name__)

DEFAULT_PORT = 9808
#: Localhost by default: the figures name sessions and applications of the database.
DEFAULT_ADDR = "127.0.0.1"


class MetricsServer:
    """An HTTP endpoint serving one table's metrics on ``/metrics`` (any path, in fact)."""

    def __init__(self, queue: DelayedQueue, *, port: int = DEFAULT_PORT,
                 addr: str = DEFAULT_ADDR, cap: int = COUNT_CAP, owns_queue: bool = False) -> None:
        self.queue = queue
        self._owns_queue = owns_queue
        registry = CollectorRegistry(auto_describe=False)
        registry.register(DelayqCollector(queue, cap=cap))
        self._httpd, self._thread = start_http_server(port, addr=addr, registry=registry)
        self.addr = addr
        self.port = int(self._httpd.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def serve_forever(self) -> None:
        """Block until interrupted (the CLI); the server thread does the work."""
        threading.Event().wait()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        if self._owns_queue:
            self.queue.close()


def serve_metrics(database_url: str, *, table: str = "delayed_queue", port: int = DEFAULT_PORT,
                  addr: str = DEFAULT_ADDR, cap: int = COUNT_CAP) -> MetricsServer:
    """Start serving in a background thread; ``port=0`` picks a free port (see ``.port``).

    Uses its own pool of two connections; needs SELECT on the queue tables (a DML-only worker
    role is enough) and ``pg_monitor`` to see other roles' sessions holding back cleanup.
    Reads only: refuses (:class:`~delayq_transport.core.SchemaMissing`) where the tables
    are missing rather than create them.
    """
    db = Database(database_url, max_size=2)
    try:
        require_schema(db, table)
        queue = DelayedQueue(db, table=table, ensure_schema=False, owns_database=True)
    except BaseException:
        db.close()
        raise
    try:
        return MetricsServer(queue, port=port, addr=addr, cap=cap, owns_queue=True)
    except BaseException:
        queue.close()
        raise


def install_celery_metrics(app: Any, *, port: int = DEFAULT_PORT, addr: str = DEFAULT_ADDR,
                           cap: int = COUNT_CAP) -> None:
    """Serve metrics from each worker's main process while it runs (Celery signals).

    Call once where the app is defined. The endpoint starts on ``worker_ready`` (after the pool
    has forked, so children do not inherit the socket) and stops on ``worker_shutdown``. The
    database is the broker's (or the ``database_url`` transport option), the table the
    ``table`` transport option.
    """
    from celery import signals

    state: dict[str, MetricsServer] = {}

    def start(sender: Any = None, **_: Any) -> None:
        options = app.conf.broker_transport_options or {}
        url = options.get("database_url") or app.conf.broker_url
        try:
            state["server"] = serve_metrics(url, table=options.get("table", "delayed_queue"),
                                            port=port, addr=addr, cap=cap)
            log.info("delayq metrics on %s", state["server"].url)
        except Exception as exc:  # metrics must never stop a worker
            log.error("delayq metrics: could not serve on %s:%s: %s", addr, port, exc)

    def stop(sender: Any = None, **_: Any) -> None:
        server = state.pop("server", None)
        if server is not None:
            server.close()

    signals.worker_ready.connect(start, weak=False)
    signals.worker_shutdown.connect(stop, weak=False)
