"""One consumer session: what every front end's consumer does between the queue and its worker.

A process that consumes holds one :class:`Session` per queue table (per kombu connection, per
Dramatiq broker). The session owns the machinery the front ends used to write twice:

* **wake-ups** (:mod:`.wakeups`): the LISTEN connection (:mod:`.listen`), every notification
  handed to the watermarks (search markers included, :meth:`.DelayedQueue.lower_watermark`) and
  to the subscriptions of its kind, and a due-time timer per subscription; when LISTEN cannot
  deliver (a transaction pooler), a short fallback poll instead;
* **one pacing policy** (:class:`.pacing.Subscription`): a wake-up or a due time polls at once;
  a poll that filled what it asked for leaves a *backlog*, and the next poll then waits for half
  the window, so each poll takes a batch however fast the worker settles; meanwhile the LISTEN
  socket is read on a timer (:data:`.wakeups.DEAF_READ_INTERVAL_S`), not once per notification;
* **leases**: every delivery taken is held until it is acked, released or dead-lettered, and
  the leases of everything held are extended every third of the lease by a thread of the
  session (:mod:`.upkeep`), so a long task keeps its lease whatever the worker's loop is doing;
* **settling**: acks are deleted in batches (every :data:`ACK_FLUSH_INTERVAL_S` or
  ``batch_size`` acks); releases and dead letters (:mod:`.dead_letters`) at once;
* the **misfire drop**: rows the front end's predicate says misfired (periodic occurrences
  that were due while no worker ran) are acked at the poll, never delivered;
* **skew retry**: a due time that turns out not due yet (host and database clocks differ by a
  little) is looked at again :data:`.pacing.SKEW_RETRY_S` later, not after the fallback poll.

It knows no framework. Two faces: a thread waits with :meth:`Session.wait_s` and the
subscription's own ``signal`` (Dramatiq's consumer threads; the session's thread reads LISTEN),
or an event loop (:mod:`.loopface`, kombu's hub) registers the session's file descriptors and
timers with :meth:`Session.attach` and gets fetched rows through each subscription's
``deliver``; :meth:`Session.serve` is the blocking form of the same for a caller's thread.
:meth:`Session.close` wakes every wait at once: a worker shutting down waits for nothing.

This module is the session itself (subscriptions, polls, settling, closing); each concept
above that stands apart lives in its own module, and :class:`Session` composes them.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, cast

from ..db.errors import DatabaseError, DatabaseUnavailable
from . import dead_letters
from .listen import Listener
from .loopface import EventLoop, LoopFace, PollJob
from .pacing import Polled, Subscription, delivery_key
from .types import Delivery, Envelope, SessionQueue
from .upkeep import Upkeep
from .wakeups import DEAF_READ_INTERVAL_S, Wakeups

if TYPE_CHECKING:
    from .delayed_queue import DelayedQueue

log = logging.getLogger(__name__)

#: Acks are deleted at least this often (and at once when ``batch_size`` are pending). 50 ms,
#: the kombu transport's documented ``ack_flush_interval`` (Dramatiq flushed every 20 ms):
#: an ack is only deleted sooner, nothing waits on it (``join`` flushes first), and a crash
#: redelivers at most this long of work either way.
ACK_FLUSH_INTERVAL_S = 0.05
#: How long closing waits for a poll in flight (to give its rows back) and for the thread.
CLOSE_WAIT_S = 5.0


class Session(Wakeups, LoopFace, Upkeep):
    """See the module docstring. ``listen`` makes a LISTEN connection (None: never listen);
    ``misfired`` picks, of the rows a poll took, those to ack without delivering; ``jobs`` are
    (interval s, callable) the session's thread also runs (bindings heartbeat, retention);
    ``freeze_gc`` freezes the process' start-up heap when the session starts (see
    :func:`.gcfreeze.freeze_start_heap`)."""

    def __init__(self, queue: SessionQueue, *, listen: Callable[[], Listener] | None,
                 polling_interval: float, unheard_polling_interval: float,
                 batch_size: int = 100, ack_flush_interval: float = ACK_FLUSH_INTERVAL_S,
                 misfired: Callable[[list[Envelope]], list[Envelope]] | None = None,
                 listen_on_thread: bool = False,
                 jobs: Sequence[tuple[float, Callable[[], object]]] = (),
                 freeze_gc: bool = True) -> None:
        self.queue = queue
        self._listen = listen
        self.polling_interval = float(polling_interval)
        self._unheard_interval = float(unheard_polling_interval)
        self.batch_size = int(batch_size)
        self.ack_flush_interval = float(ack_flush_interval)
        self._misfired = misfired
        self._listen_on_thread = listen_on_thread
        self._jobs_every = list(jobs)
        self.freeze_gc = bool(freeze_gc)
        self.lock = threading.Lock()
        self._subs: list[Subscription] = []
        self._acks: list[tuple[int, str]] = []
        self.listener: Listener | None = None
        #: LISTEN cannot deliver (a transaction pooler): poll every unheard_polling_interval.
        self.unheard = False
        #: Reading the LISTEN socket on a timer (a subscription has a backlog).
        self.deaf = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._kick_r, self._kick_w = socket.socketpair()
        for sock in (self._kick_r, self._kick_w):
            sock.setblocking(False)
        self._loop: EventLoop | None = None
        self._timers: dict[str, Any] = {}
        self._inflight: PollJob | None = None
        self._poller: threading.Thread | None = None
        self._jobs: SimpleQueue[tuple[PollJob, list[tuple[Subscription, int]]] | None]
        self._jobs = SimpleQueue()
        #: Kinds whose acks freed a concurrency slot: the session's thread flushes at once and
        #: wakes their consumers (no statement on the acking thread: kombu's hub, say).
        self._freed: set[str] = set()
        self._urgent = threading.Event()
        if listen is None:  # no wake-up will tell of a control's change: read them every second
            queue.controls_changed(heard=False)

    # -- subscriptions ---------------------------------------------------------------------

    def subscribe(self, kinds: Iterable[str], **options: Any) -> Subscription:
        sub = Subscription(self, kinds, **options)
        with self.lock:
            self._subs.append(sub)
        self.start()
        return sub

    def subscriptions(self) -> list[Subscription]:
        with self.lock:
            return [s for s in self._subs if not s.closed]

    def unsubscribe(self, sub: Subscription) -> None:
        """Delete what it acked, give back everything else it still holds; its waiter wakes."""
        sub.closed = True
        if sub.signal is not None:
            sub.signal()
        try:
            self.flush()
            with self.lock:
                held = list(sub.held.values())
                sub.held.clear()
            if held:
                self.queue.release(held)
        finally:
            with self.lock:
                if sub in self._subs:
                    self._subs.remove(sub)

    def wake(self, subs: Iterable[Subscription] | None = None) -> None:
        """Poll these (default: every subscription) at the next chance."""
        for sub in self.subscriptions() if subs is None else subs:
            sub.wanted = True
            if sub.signal is not None:
                sub.signal()

    # -- polling ---------------------------------------------------------------------------

    def fetch(self, sub: Subscription, want: int, kinds: Sequence[str] | None = None
              ) -> Polled:
        """Take up to ``want`` due rows (database work only: any thread). The misfired ones are
        acked and left out; the ones ``keep`` lets go are deleted (and delivered); the rest are
        held until settled."""
        envs, next_due = self.queue.poll(want, sub.order() if kinds is None else kinds)
        more = len(envs) >= want
        gone: list[Envelope] = []
        if envs and self._misfired is not None and (dropped := self._misfired(envs)):
            ids = {e.id for e in dropped}
            envs, gone = [e for e in envs if e.id not in ids], list(dropped)
        keep = sub.keep
        if keep is not None:
            gone += [e for e in envs if not keep(e)]
        if gone:
            self.queue.ack_many(gone)
        sub.hold(envs if keep is None else [e for e in envs if keep(e)])
        return Polled(sub, want, envs, next_due, more)

    def poll(self, sub: Subscription) -> list[Envelope]:
        """Poll ``sub`` on the caller's thread if its pacing says so; [] if not, or nothing."""
        plans = self._plans([sub])
        if not plans:
            return []
        done, error = self._run_plans(plans)
        self._learn(plans, done, error)
        return done[0].envs

    def _plans(self, subs: Iterable[Subscription] | None = None) -> list[tuple[Subscription, int]]:
        plans = []
        now_ms = time.time() * 1000
        for sub in self.subscriptions() if subs is None else subs:
            want = sub.want(self.batch_size, now_ms)
            if want:
                sub.wanted, sub.last_poll = False, time.monotonic()
                plans.append((sub, want))
        return plans

    def _run_plans(self, plans: list[tuple[Subscription, int]]
                   ) -> tuple[list[Polled], Exception | None]:
        """Fetch every plan; an error stops the pass but is returned, so what the earlier
        plans took is still delivered rather than left to its lease."""
        done = []
        for sub, want in plans:
            try:
                done.append(self.fetch(sub, want))
            except Exception as exc:
                return done, exc
        return done, None

    def _learn(self, plans: list[tuple[Subscription, int]], done: list[Polled],
               error: Exception | None) -> None:
        for p in done:
            p.sub.polled(p.more, p.next_due)
        for sub, _ in plans[len(done):]:
            sub.polled(False, None, error)
        self._hear_or_deafen(error)
        self._arm_timer()
        if error is not None:
            raise error

    def _deliver(self, plans: list[tuple[Subscription, int]], done: list[Polled],
                 error: Exception | None) -> int:
        """Learn from the polls, then hand what they took to each subscription's ``deliver``
        (rows taken before an error are delivered too, then the error is raised)."""
        try:
            self._learn(plans, done, error)
        finally:
            count = sum(int(p.sub.deliver(p.sub, p.envs) or 0)
                        for p in done if p.envs and p.sub.deliver is not None)
        return count

    def serve(self, timeout: float | None = None) -> int:
        """The blocking face for a caller's thread: read wake-ups, poll who is due, deliver;
        return once something was delivered. Raises TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.drain()
            plans = self._plans()
            if plans:
                delivered = self._deliver(plans, *self._run_plans(plans))
                if delivered:
                    return delivered
            waits = [s.wait_s() for s in self.subscriptions()] or [self.polling_interval]
            if self.deaf:
                waits.append(DEAF_READ_INTERVAL_S)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                waits.append(remaining)
            self.wait(min(waits))
            if self._stop.is_set():
                raise TimeoutError()

    # -- settling ----------------------------------------------------------------------------

    def ack(self, sub: Subscription, deliveries: Iterable[Delivery]) -> None:
        """Delete these rows: within ACK_FLUSH_INTERVAL_S, at once past ``batch_size``; at
        once too when a concurrency limit counts them (by the session's thread), and then the
        consumers of their kinds are woken to take the freed slots (core/queue/controls.py)."""
        kinds: set[str] = set()
        gone = sub.forget(deliveries, kinds)
        if not gone:
            return
        with self.lock:
            self._acks.extend(gone)
            full = len(self._acks) >= self.batch_size
        limited = self.queue.controlled(kinds)
        if limited:
            with self.lock:
                self._freed.update(limited)
            self._urgent.set()
            self.kick()
        if full:
            self.flush()

    def release(self, sub: Subscription, deliveries: Iterable[Delivery], delay: float = 0
                ) -> int:
        """Give rows back at once: due again (``delay`` seconds from now), for any consumer."""
        gone = sub.forget(deliveries)
        sub.wanted = True
        if not gone:
            return 0
        return self.queue.release(gone, delay) if delay else self.queue.release(gone)

    def dead_letter(self, sub: Subscription, deliveries: Sequence[Delivery], to_kind: str,
                    retention_s: float, payloads: Sequence[bytes | None]) -> int:
        """Move held rows to ``to_kind`` at once (kept ``retention_s``, never polled), each with
        its payload (None keeps the stored one); a row no longer held is left alone."""
        by_key = dict(zip(map(delivery_key, deliveries), payloads, strict=True))
        gone = sub.forget(by_key)
        if not gone:
            return 0
        return dead_letters.dead_letter(cast("DelayedQueue", self.queue), gone, to_kind,
                                      retention_s, [by_key[k] for k in gone])

    def flush(self) -> None:
        """Delete every pending ack now; kept for the next flush when the database fails."""
        with self.lock:
            acks, self._acks = self._acks, []
        if acks:
            try:
                self.queue.ack_many(acks)
            except BaseException:
                with self.lock:
                    self._acks[:0] = acks
                raise

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop: every wait wakes at once; acks are flushed, a poll in flight given back."""
        self._stop.set()
        self._urgent.set()
        self.kick()
        for sub in self.subscriptions():
            if sub.signal is not None:
                sub.signal()
        self._jobs.put(None)
        future, self._inflight = self._inflight, None
        if future is not None:
            try:
                _, done, _ = future.result(timeout=CLOSE_WAIT_S)
                for p in done:
                    self.release(p.sub, p.envs)
            except (TimeoutError, DatabaseUnavailable, DatabaseError) as exc:
                log.warning("delayq: a poll in flight at close could not be undone; its "
                            "messages come back when their lease ends: %s", exc)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=CLOSE_WAIT_S)
        try:
            self.flush()
        except (DatabaseUnavailable, DatabaseError) as exc:
            log.warning("delayq: could not flush acks on close (they will be redelivered): "
                        "%s", exc)
        for name in list(self._timers):
            self._timer(name, None)
        loop = self._loop
        if loop is not None:
            try:
                loop.remove_reader(self._kick_r.fileno())
            except (OSError, ValueError, KeyError):
                pass
            loop.on_tick.discard(self._on_tick)
        self._close_listener()
        self._kick_r.close()
        self._kick_w.close()
