"""The session's wake-ups: its LISTEN connection, the notifications it hands on, its kick.

Every notification lowers the watermarks (search markers included) and wakes the subscriptions
of its kind; a control note re-reads the controls; a lost connection means notifications may be
lost, so everyone polls from the bottom until LISTEN is back; LISTEN that cannot deliver (a
transaction pooler) turns the session to a short fallback poll. Its own module because this is
the one part of the session that talks to the notification channel, whichever face (a waiting
thread or an event loop) reads it.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..db.errors import DatabaseUnavailable, ListenUndeliverable
from .controls import CONTROL_NOTE
from .listen import Listener

if TYPE_CHECKING:
    from .loopface import EventLoop
    from .pacing import Subscription
    from .types import SessionQueue

log = logging.getLogger(__name__)

#: While a subscription has a backlog it polls as soon as its window has room, so a wake-up per
#: published message tells it nothing: the LISTEN socket is then read this often instead of on
#: every notification (a read costs ~50 us of the reading thread, 0.6-0.7 per task on a busy
#: kombu worker). Nothing is lost: the server keeps the notifications until they are read.
DEAF_READ_INTERVAL_S = 0.1


class Wakeups:
    """The session's wake-ups (a part of :class:`~.session.Session`, which holds the state)."""

    if TYPE_CHECKING:
        queue: SessionQueue
        listener: Listener | None
        unheard: bool
        deaf: bool
        polling_interval: float
        _listen: Callable[[], Listener] | None
        _unheard_interval: float
        _stop: threading.Event
        _loop: EventLoop | None
        _kick_r: socket.socket
        _kick_w: socket.socket

        def subscriptions(self) -> list[Subscription]: ...

        def wake(self, subs: Iterable[Subscription] | None = None) -> None: ...

        def _timer(self, name: str, timer: Any) -> None: ...

        def _arm_timer(self) -> None: ...

    def listening(self) -> None:
        """Make sure the LISTEN connection is up (a no-op when LISTEN cannot deliver)."""
        if self.unheard or self._listen is None or self._stop.is_set():
            return
        listener = self.listener
        if listener is not None and not listener.closed:
            return
        try:
            listener = self._listen()
        except ListenUndeliverable as exc:
            log.log(logging.INFO if exc.expected else logging.WARNING, "delayq: %s", exc)
            self.unheard = True
            self.queue.disable_watermarks()  # only NOTIFYs keep it sound
            self.queue.controls_changed(heard=False)
            self.polling_interval = min(self.polling_interval, self._unheard_interval)
            if self._loop is not None:
                self._timer("unheard", self._loop.call_repeatedly(self.polling_interval,
                                                                  self.wake))
            return
        self.listener = listener
        if self._loop is not None and not self.deaf:
            self._loop.add_reader(listener.fd, self.drain)
        # What was published before it listened was not heard: everyone polls, from the bottom,
        # and control changes made meanwhile are read (core/queue/controls.py).
        self.queue.reset_watermarks()
        self.queue.controls_changed(heard=True)
        self.wake()

    def _lost(self, exc: Exception) -> None:
        """Notifications may have been lost: reconnect, and everyone polls from the bottom."""
        log.warning("delayq: %s; polling until LISTEN is back", exc)
        self._close_listener()
        self.queue.reset_watermarks()
        self.queue.controls_changed(heard=False)
        self.wake()
        try:
            self.listening()
        except DatabaseUnavailable as exc2:
            log.warning("delayq: LISTEN unavailable, polling until it is back: %s", exc2)

    def drain(self) -> None:
        """Hand every notification received so far to the watermarks and subscriptions."""
        listener = self.listener
        if listener is None:
            return
        try:
            notes = listener.drain()
        except DatabaseUnavailable as exc:
            self._lost(exc)
            return
        if notes:
            self.dispatch(notes)

    def dispatch(self, notes: list[tuple[str, int]]) -> None:
        if any(kind == CONTROL_NOTE for kind, _ in notes):  # a queue paused, resumed, limited
            self.queue.controls_changed()
            self.wake()
            notes = [n for n in notes if n[0] != CONTROL_NOTE]
        lower = self.queue.lower_watermark
        for kind, at_ms in notes:
            lower(kind, at_ms)  # search markers too: the next poll scans from below this row
        now_ms, earlier = time.time() * 1000, False
        for sub in self.subscriptions():
            mine = [at for kind, at in notes if kind in sub.kinds]
            if mine:
                later = [at for at in mine if at > now_ms]
                earlier |= sub.notify(len(later) < len(mine), min(later) if later else None)
        if earlier:
            self._arm_timer()

    def wait(self, timeout: float) -> None:
        """Block until a notification may have arrived, the session was kicked (closing, a poll
        done), or ``timeout`` passed."""
        fds: list[Any] = [self._kick_r]
        listener = self.listener
        if listener is not None and not listener.closed and not self.deaf:
            fds.append(listener.fd)
        try:
            ready, _, _ = select.select(fds, [], [], max(timeout, 0.0))
        except (OSError, ValueError) as exc:
            self._lost(exc)
            return
        if self._kick_r in ready:
            self._drain_kicks()

    def kick(self) -> None:
        """Wake whoever waits on the session (safe from a signal handler: one send)."""
        try:
            self._kick_w.send(b"\0")
        except OSError:  # closed, or already full of kicks
            pass

    def _drain_kicks(self) -> None:
        try:
            self._kick_r.recv(4096)
        except OSError:
            pass

    def _hear_or_deafen(self, error: Exception | None = None) -> None:
        """Deaf while a subscription has a backlog (see DEAF_READ_INTERVAL_S); hearing again
        reads at once what came meanwhile."""
        deaf = error is None and any(s.backlog for s in self.subscriptions())
        if deaf == self.deaf:
            return
        self.deaf = deaf
        loop, listener = self._loop, self.listener
        if loop is None:  # the thread that waits reads it (one reader: libpq is not shared)
            return
        if deaf:
            self._timer("deaf", loop.call_repeatedly(DEAF_READ_INTERVAL_S, self.drain))
            if listener is not None:
                loop.remove_reader(listener.fd)
            return
        self._timer("deaf", None)
        if listener is not None:
            loop.add_reader(listener.fd, self.drain)
            self.drain()

    def _close_listener(self) -> None:
        listener, self.listener = self.listener, None
        if listener is None:
            return
        if self._loop is not None and not self.deaf:
            try:
                self._loop.remove_reader(listener.fd)
            except (OSError, ValueError, KeyError):
                pass
        listener.close()

