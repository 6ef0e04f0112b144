"""The ``delayq-maintenance`` thread: ack flushes, lease extension, binding heartbeat.

It runs beside the consumer so that a long task (even on the solo pool, whose loop is busy
running it) keeps its lease, and batched acks reach the database within
``ack_flush_interval`` whatever the event loop is doing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..core.errors import DatabaseError, DatabaseUnavailable
from .options import DEFAULT_BINDING_TTL_S

if TYPE_CHECKING:
    from .ports import TransportPort

log = logging.getLogger(__name__)


class Maintenance:
    """Started with the first consumer (or ``basic_get``), stopped when the transport closes."""

    def __init__(self, transport: TransportPort) -> None:
        self.transport = transport
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ensure(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="delayq-maintenance",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def sleep(self, timeout: float) -> None:
        """Wait ``timeout`` seconds, or less if the transport is closing."""
        self._stop.wait(timeout)

    def _run(self) -> None:
        next_lease = next_touch = next_janitor = 0.0
        while not self._stop.wait(self.transport.ack_flush_interval):
            now = time.monotonic()
            try:
                for channel in self.transport.all_channels():
                    channel.flush_acks()
                if now >= next_lease:
                    next_lease = now + self.transport.lease_s / 3
                    self.extend_leases()
                if now >= next_touch:
                    next_touch = now + DEFAULT_BINDING_TTL_S / 4
                    self.touch_bindings()
                if now >= next_janitor:
                    next_janitor = now + DEFAULT_BINDING_TTL_S
                    self.transport.backend.bindings.drop_stale_transient(
                        int(DEFAULT_BINDING_TTL_S * 10 * 1000))
            except (DatabaseUnavailable, DatabaseError) as exc:
                log.warning("delayq: maintenance failed, will retry: %s", exc)

    def extend_leases(self) -> None:
        locks: set[str] = set()
        for channel in self.transport.all_channels():
            locks |= channel.held_locks()
        if locks:
            self.transport.backend.queue.extend_lease(locks)

    def touch_bindings(self) -> None:
        queues = sorted({q for c in self.transport.consuming() for q in c.consumed_queues()})
        self.transport.backend.bindings.touch(queues)
