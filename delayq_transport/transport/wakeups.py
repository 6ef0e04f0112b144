"""LISTEN/NOTIFY wake-ups of a transport: one listening connection, shared by its channels.

A notification ``kind:ms`` makes each channel consuming that kind poll now (the row is due) or
arms its due timer (the row is due later). When the connection breaks (server restart), the
transport polls everything and reconnects; nothing is missed for long, only found by a poll.

While a channel of the worker has a backlog it polls again as soon as its window has room, so
a wake-up per published message tells it nothing: every read of the socket (~50 us of the
event loop's thread, 0.6-0.7 per task) is then spent for nothing, on the thread that limits a
busy worker. The transport makes the wake-ups *deaf* meanwhile: the socket leaves the event
loop and is read every ``BACKLOG_DRAIN_INTERVAL_S`` instead, a hundred notifications at once.
Nothing is dropped, only handed out later: the LISTEN stays, the server keeps every
notification in the socket until it is read, and the read that ends the episode (the first
poll that comes back short) hands out all of them, lowering the watermarks as usual.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..core.errors import DatabaseUnavailable, ListenUndeliverable
from ..core.listen import Listener
from .options import BACKLOG_DRAIN_INTERVAL_S, DEFAULT_UNHEARD_POLLING_INTERVAL_S

if TYPE_CHECKING:
    from .ports import TransportPort

log = logging.getLogger(__name__)


class Wakeups:
    """Owns the transport's :class:`~delayq_transport.core.listen.Listener`."""

    def __init__(self, transport: TransportPort) -> None:
        self.transport = transport
        self.listener: Listener | None = None
        self._lock = threading.Lock()
        self._hub: Any = None
        #: Read on a timer instead of on every notification (a channel has a backlog).
        self.deaf = False
        self._deaf_timer: Any = None
        #: LISTEN cannot deliver (behind a transaction pooler): the transport polls every
        #: ``unheard_polling_interval`` instead, and does not try LISTEN again.
        self.unheard = False
        self._unheard_timer: Any = None

    @property
    def fd(self) -> int | None:
        listener = self.listener
        return None if listener is None else listener.fd

    def attach(self, hub: Any) -> None:
        """Register the listening socket with Celery's event loop (now or once it exists)."""
        self._hub = hub
        if self.listener is not None and not self.deaf:
            hub.add_reader(self.listener.fd, self.drain)
        if self.unheard:
            self._poll_instead()

    def ensure(self) -> None:
        if self.unheard:
            return
        with self._lock:
            if self.listener is not None and not self.listener.closed:
                return
            try:
                self.listener = self.transport.backend.listener()
            except ListenUndeliverable:
                self.unheard = True
            else:
                fd = self.listener.fd
        if self.unheard:
            self._poll_instead()
        elif self._hub is not None and not self.deaf:
            self._hub.add_reader(fd, self.drain)

    def _poll_instead(self) -> None:
        """No wake-ups will come: poll on a short fixed interval (the bound on how late a new
        task is found; a known next due time is still met by its own timer)."""
        transport = self.transport
        interval = float(transport.options.get("unheard_polling_interval",
                                               DEFAULT_UNHEARD_POLLING_INTERVAL_S))
        transport.polling_interval = min(transport.polling_interval, interval)
        if self._hub is not None and self._unheard_timer is None:
            self._unheard_timer = self._hub.call_repeatedly(transport.polling_interval,
                                                            transport.wake)

    def deafen(self, deaf: bool) -> None:
        """Read the socket on a timer (``deaf``) or on every notification. Hearing again reads
        at once what came meanwhile."""
        hub = self._hub
        if deaf == self.deaf or hub is None:
            return
        listener = self.listener
        if deaf:
            self.deaf = True
            self._deaf_timer = hub.call_repeatedly(BACKLOG_DRAIN_INTERVAL_S, self.drain)
            if listener is not None:
                hub.remove_reader(listener.fd)
            return
        self._hear()
        if listener is not None:
            hub.add_reader(listener.fd, self.drain)
            self.drain()

    def _hear(self) -> bool:
        """Leave the deaf state (the socket is not in the loop yet); True if it was deaf."""
        was_deaf, self.deaf = self.deaf, False
        if self._deaf_timer is not None:
            self._deaf_timer.cancel()
            self._deaf_timer = None
        return was_deaf

    def close(self) -> None:
        was_deaf = self._hear()
        with self._lock:
            listener, self.listener = self.listener, None
        if listener is None:
            return
        if self._hub is not None and not was_deaf:
            try:
                self._hub.remove(listener.fd)
            except (OSError, ValueError, KeyError):
                pass
        listener.close()

    def reset(self) -> None:
        """The connection broke: reconnect, and poll for what we missed (from the bottom:
        announcements that would have lowered the watermarks were lost too)."""
        self.close()
        self.transport.backend.queue.reset_watermarks()
        self.transport.wake()
        if self.transport.consuming():
            try:
                self.ensure()
            except DatabaseUnavailable as exc:
                log.warning("delayq: LISTEN connection lost, polling until it is back: %s", exc)

    def wait(self, timeout: float) -> None:
        """Block until a notification may have arrived (``drain_events`` without a loop)."""
        listener = self.listener
        if listener is None or listener.closed:
            self.transport.sleep(timeout)
            return
        try:
            listener.wait(timeout)
        except DatabaseUnavailable:
            self.reset()

    def drain(self) -> None:
        """Hand every notification received so far to the channels consuming its kind."""
        listener = self.listener
        if listener is None:
            return
        try:
            notes = listener.drain()
        except DatabaseUnavailable:
            self.reset()
            return
        if not notes:
            return
        consumers = [(c, c.consumed_kinds()) for c in self.transport.consuming()]
        now_ms = time.time() * 1000
        queue = self.transport.backend.queue
        for kind, at_ms in notes:
            queue.lower_watermark(kind, at_ms)  # the next poll scans from below this row
            for channel, kinds in consumers:
                if kind not in kinds:
                    continue
                if at_ms <= now_ms:
                    channel.poll_wanted = True
                elif channel.next_due_ms is None or at_ms < channel.next_due_ms:
                    channel.next_due_ms = at_ms
                    self.transport.schedule_hub_timer()
