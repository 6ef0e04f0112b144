"""What one process shares per database: the pool, the queue and the bindings built on it."""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from ..core import ListenUndeliverable, SchemaMissing
from ..core.db import Database
from ..core.integrations import Bindings
from ..core.queue import DelayedQueue, Listener, PublishBuffer, check_linger
from ..core.schema import set_unlogged, wait_for_schema
from ..formats import celery as msg
from ..formats import queues
from .options import TRANSPORT_OPTIONS

log = logging.getLogger(__name__)

#: Set by Celery's ``worker_init`` (kombu_transport.py): this process is a ``celery worker``,
#: whose backend waits for delayq's tables (core/schema: ``wait_for_schema``) where a producer
#: fails at once.
IN_WORKER = threading.Event()
#: Set by Celery's ``worker_shutting_down``: a worker told to stop while it waits stops.
WORKER_STOPPING = threading.Event()


class Backend:
    """Celery opens several kombu connections per worker (consumer, events, control); sharing
    the pool keeps a worker at a handful of PostgreSQL connections. Keyed by pid, so a forked
    child never reuses its parent's sockets."""

    _registry: dict[tuple[int, str, str], Backend] = {}
    _registry_lock = threading.Lock()

    def __init__(self, url: str, options: dict[str, Any], key: tuple[int, str, str]) -> None:
        self.url = url
        self._key = key
        def opt(name: str) -> Any:
            return TRANSPORT_OPTIONS.read(options, name)

        self.table = str(opt("table"))
        self.db = Database(url, max_size=int(opt("pool_size")), min_size=int(opt("pool_min_size")),
                           connect_timeout_s=float(opt("connect_timeout")),
                           single_pool=bool(opt("single_pool")), pooling=str(opt("pooling")),
                           listen_url=opt("listen_url"))
        try:
            wait = bool(opt("ensure_schema")) and IN_WORKER.is_set()
            if wait:
                self._wait_for_schema(float(opt("schema_wait")))
            self.queue = DelayedQueue(
                self.db,
                kind=msg.DEFAULT_QUEUE,
                table=self.table,
                acquire_timeout=float(opt("acquire_timeout")),
                ensure_schema=bool(opt("ensure_schema")) and not wait,
                relaxed_consumer_commits=not opt("durable_acks"),
                # Polls start at this consumer's low watermark (core/queue/watermark.py); Wakeups
                # feeds it every NOTIFY and resets it when LISTEN was lost.
                low_watermark=bool(opt("low_watermark")),
                full_rescan_interval=float(opt("full_rescan_interval")),
                naming=queues,
            )
            unlogged = opt("unlogged_table")
            if unlogged is not None:  # None: leave the table as the operator made it
                set_unlogged(self.db, self.table, bool(unlogged))
        except BaseException:
            self.db.close()
            raise
        #: Why LISTEN cannot deliver in this process (None: it can, or was not tried yet).
        self.listen_error: ListenUndeliverable | None = None
        self.bindings = Bindings(self.db, self.queue.queries)
        self.users = 0
        self._by_kind: dict[str, DelayedQueue] = {}
        linger = check_linger(TRANSPORT_OPTIONS.read(options, "publish_linger"))
        #: ``publish_linger`` on: this process' publishes, written in batches (off: None).
        self.publisher = PublishBuffer(self.queue_for, linger) if linger else None

    def _wait_for_schema(self, timeout_s: float) -> None:
        try:
            wait_for_schema(self.db, self.table, timeout_s=timeout_s, stop=WORKER_STOPPING)
        except SchemaMissing:
            if WORKER_STOPPING.is_set():  # a warm shutdown before it started: nothing to undo
                raise SystemExit(0) from None
            raise

    def flush_publishes(self) -> None:
        """Write what this process buffered first: a purge or a count must see it."""
        if self.publisher is not None:
            self.publisher.flush()

    def queue_for(self, kind: str) -> DelayedQueue:
        """The queue of one kind, built once (publishing asks for it every time)."""
        queue = self._by_kind.get(kind)
        if queue is None:
            queue = self._by_kind[kind] = self.queue.with_kind(kind)
        return queue

    def listener(self) -> Listener:
        """A new LISTENing connection for this table's wake-ups.

        Raises ListenUndeliverable, once found and from then on without trying again (each
        probe waits up to 2 s), when LISTEN cannot deliver (see core/queue/listen.py); the consumer
        session then polls instead, with the low watermark off."""
        if self.listen_error is not None:
            raise self.listen_error
        try:
            return Listener(self.db, self.queue.queries)
        except ListenUndeliverable as exc:
            self.listen_error = exc
            raise

    @classmethod
    def acquire(cls, url: str, options: dict[str, Any]) -> Backend:
        key = (os.getpid(), url, json.dumps(options, sort_keys=True, default=str))
        with cls._registry_lock:
            backend = cls._registry.get(key)
            if backend is None:
                backend = cls._registry[key] = Backend(url, options, key)
            backend.users += 1
            return backend

    def release(self) -> None:
        with self._registry_lock:
            self.users -= 1
            if self.users <= 0:
                self._registry.pop(self._key, None)
                if self.publisher is not None:
                    self.publisher.close()
                self.queue.close()  # sends the wake-ups still pending (core/queue/announce.py)
                self.db.close()
