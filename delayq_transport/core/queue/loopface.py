"""What an event loop (kombu's hub) sees of the session: readers, timers, a tick, a poller.

The loop must never wait on a statement, so a tick hands the polls due to a thread of the
session and delivers what they took when that thread kicks the loop; the due-time, fallback,
unheard and deaf-read timers are the loop's own. Its own module because a session waited on by a
thread (Dramatiq's consumers, ``serve``) uses none of it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, Protocol

from ..db.errors import DatabaseUnavailable
from .gcfreeze import freeze_start_heap
from .pacing import SKEW_RETRY_S, Polled, Subscription

if TYPE_CHECKING:
    from .listen import Listener

#: A poll run by the event-loop face's thread: (plans, what each took, the error that stopped it).
PollJob = Future[tuple[list[tuple["Subscription", int]], list["Polled"], Exception | None]]


class EventLoop(Protocol):
    """An event loop as the session uses it (kombu's ``Hub`` has this shape)."""

    on_tick: set[Callable[[], None]]

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None: ...

    def remove_reader(self, fd: int) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any: ...

    def call_repeatedly(self, interval: float, callback: Callable[[], None]) -> Any: ...


class LoopFace:
    """The event-loop face (a part of :class:`~.session.Session`, which holds the state)."""

    if TYPE_CHECKING:
        freeze_gc: bool
        polling_interval: float
        listener: Listener | None
        unheard: bool
        deaf: bool
        _listen: Callable[[], Listener] | None
        _stop: threading.Event
        _loop: EventLoop | None
        _timers: dict[str, Any]
        _inflight: PollJob | None
        _poller: threading.Thread | None
        _jobs: SimpleQueue[tuple[PollJob, list[tuple[Subscription, int]]] | None]
        _kick_r: socket.socket

        def subscriptions(self) -> list[Subscription]: ...

        def wake(self, subs: Iterable[Subscription] | None = None) -> None: ...

        def drain(self) -> None: ...

        def kick(self) -> None: ...

        def _drain_kicks(self) -> None: ...

        def _lost(self, exc: Exception) -> None: ...

        def _plans(self, subs: Iterable[Subscription] | None = None
                   ) -> list[tuple[Subscription, int]]: ...

        def _run_plans(self, plans: list[tuple[Subscription, int]]
                       ) -> tuple[list[Polled], Exception | None]: ...

        def _deliver(self, plans: list[tuple[Subscription, int]], done: list[Polled],
                     error: Exception | None) -> int: ...

    def attach(self, loop: EventLoop) -> None:
        """Run the wake-ups, timers and polls on ``loop``: polls are fetched on a thread of
        the session (a statement on the loop would stall everything else it does) and handed
        to each subscription's ``deliver`` on the loop thread."""
        if self.freeze_gc:
            freeze_start_heap()
        self._loop = loop
        loop.add_reader(self._kick_r.fileno(), self._on_kick)
        loop.on_tick.add(self._on_tick)
        self._timer("fallback", loop.call_repeatedly(self.polling_interval, lambda: None))
        if self.listener is not None and not self.deaf:
            loop.add_reader(self.listener.fd, self.drain)
        if self.unheard:
            self._timer("unheard", loop.call_repeatedly(self.polling_interval, self.wake))

    def _timer(self, name: str, timer: Any) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        if timer is not None:
            self._timers[name] = timer

    def _arm_timer(self) -> None:
        """Wake the loop exactly when the earliest known row becomes due (it does nothing when
        it fires: the loop comes round and the tick sees who is due)."""
        loop = self._loop
        if loop is None:  # a waiting thread computes its own wait (Subscription.wait_s)
            return
        dues = [s.next_due_ms for s in self.subscriptions() if s.next_due_ms is not None]
        if dues:
            wait = max(min(dues) / 1000 - time.time(), SKEW_RETRY_S)
            self._timer("due", loop.call_later(wait, lambda: None))

    def _on_tick(self) -> None:
        # The loop ticks ~2 times per task under load: a poll in flight is answered first.
        if self._inflight is not None or self._stop.is_set():
            return
        plans = self._plans()
        if not plans:
            return
        if self.listener is None and not self.unheard and self._listen is not None:
            self._lost(DatabaseUnavailable("LISTEN connection lost"))
        future: PollJob = Future()
        self._inflight = future
        if self._poller is None or not self._poller.is_alive():
            self._jobs = SimpleQueue()  # a stopped poller's queue may hold its stop mark
            self._poller = threading.Thread(target=self._poll_thread, args=(self._jobs,),
                                            name="delayq-poller", daemon=True)
            self._poller.start()
        self._jobs.put((future, plans))

    def _poll_thread(self, jobs: SimpleQueue[tuple[PollJob, list[tuple[Subscription, int]]]
                                             | None]) -> None:
        while (job := jobs.get()) is not None:
            future, plans = job
            future.set_result((plans, *self._run_plans(plans)))
            self.kick()

    def _on_kick(self) -> None:
        self._drain_kicks()
        future = self._inflight
        if future is None or not future.done():
            return
        self._inflight = None
        self._deliver(*future.result())

