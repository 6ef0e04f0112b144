"""The session thread's jobs: ack flushing, lease extension, freed slots, the caller's jobs.

One thread per session runs them on their intervals (acks every ``ack_flush_interval``, leases
every third of the lease, each of the caller's ``jobs`` on its own, e.g. the bindings heartbeat
and retention), and frees counted concurrency slots at once when an ack asks; for a session
waited on by threads it also reads LISTEN. Its own module because this is upkeep that no
consumer waits for: a long task keeps its lease whatever its worker's loop is doing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..db.errors import DatabaseError, DatabaseUnavailable
from .gcfreeze import freeze_start_heap
from .wakeups import DEAF_READ_INTERVAL_S

if TYPE_CHECKING:
    from .pacing import Subscription
    from .types import SessionQueue

log = logging.getLogger(__name__)


class Upkeep:
    """The session's thread (a part of :class:`~.session.Session`, which holds the state)."""

    if TYPE_CHECKING:
        queue: SessionQueue
        lock: threading.Lock
        freeze_gc: bool
        deaf: bool
        ack_flush_interval: float
        _stop: threading.Event
        _thread: threading.Thread | None
        _listen_on_thread: bool
        _jobs_every: list[tuple[float, Callable[[], object]]]
        _urgent: threading.Event
        _freed: set[str]

        def subscriptions(self) -> list[Subscription]: ...

        def wake(self, subs: Iterable[Subscription] | None = None) -> None: ...

        def listening(self) -> None: ...

        def wait(self, timeout: float) -> None: ...

        def drain(self) -> None: ...

        def flush(self) -> None: ...

    def start(self) -> None:
        if self.freeze_gc:
            freeze_start_heap()
        with self.lock:
            if self._stop.is_set() or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._run, name="delayq-session",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        next_flush = next_lease = next_read = 0.0
        next_jobs = [0.0] * len(self._jobs_every)
        while not self._stop.is_set():
            now = time.monotonic()
            if self._listen_on_thread:
                try:
                    self.listening()
                except DatabaseUnavailable as exc:
                    log.warning("delayq: LISTEN unavailable, polling until it is back: %s", exc)
                    self.wake()
                self.wait(min(next_flush, next_read if self.deaf else next_flush) - now)
                if not self.deaf or time.monotonic() >= next_read:
                    next_read = time.monotonic() + DEAF_READ_INTERVAL_S
                    self.drain()
            else:
                self._urgent.wait(max(next_flush - now, 0.0))
            now = time.monotonic()
            if self._urgent.is_set():
                self._free_slots()
            if now < next_flush:
                continue  # woken by a notification: acks wait for their interval
            next_flush = now + self.ack_flush_interval
            try:
                self.flush()
                if now >= next_lease:
                    next_lease = now + self.queue.lease_ms / 3000
                    self.extend_leases()
                for i, (interval, job) in enumerate(self._jobs_every):
                    if now >= next_jobs[i]:
                        next_jobs[i] = now + interval
                        job()
            except (DatabaseUnavailable, DatabaseError) as exc:
                log.warning("delayq: maintenance failed, will retry: %s", exc)

    def _free_slots(self) -> None:
        """Delete the acks that freed concurrency slots, then wake the consumers of those
        kinds (a failure leaves them to the next flush and the claimers' retry)."""
        self._urgent.clear()
        with self.lock:
            kinds, self._freed = self._freed, set()
        try:
            self.flush()
            if kinds:
                self.queue.wake_claimers(kinds)
        except (DatabaseUnavailable, DatabaseError) as exc:
            log.warning("delayq: could not free concurrency slots at once: %s", exc)

    def extend_leases(self) -> None:
        locks: set[str] = set()
        for sub in self.subscriptions():
            locks |= sub.locks()
        if locks:
            self.queue.extend_lease(locks)

