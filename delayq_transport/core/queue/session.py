"""One consumer session: what every front end's consumer does between the queue and its worker.

A process that consumes holds one :class:`Session` per queue table (per kombu connection, per
Dramatiq broker). The session owns the machinery the front ends used to write twice:

* **wake-ups**: the LISTEN connection (:mod:`.listen`), every notification handed to the
  watermarks (search markers included, :meth:`.DelayedQueue.lower_watermark`) and to the
  subscriptions of its kind, and a due-time timer per subscription; when LISTEN cannot deliver
  (a transaction pooler), a short fallback poll instead;
* **one pacing policy** (:class:`Subscription`): a wake-up or a due time polls at once; a poll
  that filled what it asked for leaves a *backlog*, and the next poll then waits for half the
  window, so each poll takes a batch however fast the worker settles; meanwhile the LISTEN
  socket is read on a timer (:data:`DEAF_READ_INTERVAL_S`), not once per notification;
* **leases**: every delivery taken is held until it is acked, released or dead-lettered, and
  the leases of everything held are extended every third of the lease by a thread of the
  session, so a long task keeps its lease whatever the worker's own loop is doing;
* **settling**: acks are deleted in batches (every :data:`ACK_FLUSH_INTERVAL_S` or
  ``batch_size`` acks); releases and dead letters (:mod:`.dead_letters`) at once;
* the **misfire drop**: rows the front end's predicate says misfired (periodic occurrences
  that were due while no worker ran) are acked at the poll, never delivered;
* **skew retry**: a due time that turns out not due yet (host and database clocks differ by a
  little) is looked at again :data:`SKEW_RETRY_S` later, not after the fallback poll.

It knows no framework. Two faces: a thread waits with :meth:`Session.wait_s` and the
subscription's own ``signal`` (Dramatiq's consumer threads; the session's thread reads LISTEN),
or an event loop (:class:`EventLoop`, kombu's hub) registers the session's file descriptors and
timers with :meth:`Session.attach` and gets fetched rows through each subscription's
``deliver``; :meth:`Session.serve` is the blocking form of the same for a caller's thread.
:meth:`Session.close` wakes every wait at once: a worker shutting down waits for nothing.
"""

from __future__ import annotations

import gc
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..db.errors import DatabaseError, DatabaseUnavailable, ListenUndeliverable
from . import dead_letters
from .controls import CONTROL_NOTE
from .listen import Listener
from .types import Envelope

if TYPE_CHECKING:
    from .delayed_queue import DelayedQueue

log = logging.getLogger(__name__)

#: A due time that found nothing due (host and database clocks differ slightly) is looked at
#: again this much later.
SKEW_RETRY_S = 0.005
#: Acks are deleted at least this often (and at once when ``batch_size`` are pending). 50 ms,
#: the kombu transport's documented ``ack_flush_interval`` (Dramatiq flushed every 20 ms):
#: an ack is only deleted sooner, nothing waits on it (``join`` flushes first), and a crash
#: redelivers at most this long of work either way.
ACK_FLUSH_INTERVAL_S = 0.05
#: While a subscription has a backlog it polls as soon as its window has room, so a wake-up per
#: published message tells it nothing: the LISTEN socket is then read this often instead of on
#: every notification (a read costs ~50 us of the reading thread, 0.6-0.7 per task on a busy
#: kombu worker). Nothing is lost: the server keeps the notifications until they are read.
DEAF_READ_INTERVAL_S = 0.1
#: How long closing waits for a poll in flight (to give its rows back) and for the thread.
CLOSE_WAIT_S = 5.0

_frozen = threading.Lock()
_heap_frozen = False


def freeze_start_heap() -> bool:
    """Once per process: collect, then move every object alive now to the collector's
    permanent generation (:func:`gc.freeze`). Why: a consumer starts after its worker built
    its long-lived heap (framework, app, modules, task registry); a full collection would walk
    all of it again and again, on the thread that delivers countdowns. Measured (bench_burst,
    Celery prefork main process, ~104k start-up objects): one 58 ms collection delayed a
    burst's countdowns by up to 68 ms; frozen, the same burst's worst was 10.9 ms. Objects made
    afterwards are collected as before. True when this call froze."""
    global _heap_frozen
    with _frozen:
        if _heap_frozen:
            return False
        _heap_frozen = True
    gc.collect()
    gc.freeze()
    return True


#: A poll run by the event-loop face's thread: (plans, what each took, the error that stopped it).
PollJob = Future[tuple[list[tuple["Subscription", int]], list["Polled"], Exception | None]]
#: A delivery as the queue matches it: an envelope, or its (id, lock).
Delivery = Envelope | tuple[int, str]


class SessionQueue(Protocol):
    """What the session calls on the queue (:class:`~.delayed_queue.DelayedQueue` has it)."""

    lease_ms: int

    def poll(self, n: int, kinds: Sequence[str] | None = None
             ) -> tuple[list[Envelope], int | None]: ...

    def ack_many(self, deliveries: Iterable[Delivery]) -> int: ...

    def release(self, deliveries: Iterable[Delivery], delay: float = 0) -> int: ...

    def extend_lease(self, locks: Iterable[str]) -> int: ...

    def lower_watermark(self, kind: str, at_ms: int) -> None: ...

    def reset_watermarks(self) -> None: ...

    def disable_watermarks(self) -> None: ...

    def controls_changed(self, heard: bool | None = None) -> None: ...

    def controlled(self, kinds: Iterable[str]) -> list[str]: ...

    def wake_claimers(self, kinds: Iterable[str]) -> None: ...


class EventLoop(Protocol):
    """An event loop as the session uses it (kombu's ``Hub`` has this shape)."""

    on_tick: set[Callable[[], None]]

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None: ...

    def remove_reader(self, fd: int) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any: ...

    def call_repeatedly(self, interval: float, callback: Callable[[], None]) -> Any: ...


def _key(delivery: Delivery) -> tuple[int, str]:
    return (delivery.id, delivery.lock) if isinstance(delivery, Envelope) else delivery


class Subscription:
    """One consumer of a session: the kinds it polls, its window, its pacing, what it holds.

    ``capacity`` returns (room, window): how many more deliveries it may take now (None: no
    limit) and its whole window (None: none); by default the window is ``window`` and the
    room what is not held. ``signal`` wakes whoever waits for it (a thread's event) when a
    wake-up, a due time or freed room concerns it. ``deliver`` hands over rows polled on the
    session's behalf (the event-loop face). ``order`` gives the kinds in the order of the next
    poll (default: ``kinds`` as given, highest priority first); ``keep`` says whether a
    delivery stays held until settled (default: all; the others are deleted at the poll:
    delivered means gone).
    """

    def __init__(self, session: Session, kinds: Iterable[str], *, window: int | None = None,
                 capacity: Callable[[], tuple[int | None, int | None]] | None = None,
                 signal: Callable[[], None] | None = None,
                 deliver: Callable[[Subscription, list[Envelope]], Any] | None = None,
                 order: Callable[[], list[str]] | None = None,
                 keep: Callable[[Envelope], bool] | None = None) -> None:
        self.session = session
        ordered = list(dict.fromkeys(kinds))
        self.kinds = set(ordered)
        self.window = window
        self._capacity = capacity
        self.signal = signal
        self.deliver = deliver
        self._order = order if order is not None else ordered.copy
        self._given_order = order is not None
        self.keep = keep
        #: Poll at the next chance (start-up, a wake-up, an error, notifications lost).
        self.wanted = True
        #: The last poll filled what it asked for: more is due already.
        self.backlog = False
        #: Earliest known due time (epoch ms) of its kinds; None: none known.
        self.next_due_ms: int | None = None
        self.last_poll = 0.0
        self.closed = False
        self.held: dict[tuple[int, str], Envelope] = {}

    def set_kinds(self, kinds: Iterable[str]) -> None:
        """Consume these kinds from now on (a queue added or cancelled at run time). An added
        kind's rows may be waiting already, their NOTIFY gone to no one: it polls at the next
        chance, not at the fallback poll."""
        ordered = list(dict.fromkeys(kinds))
        added = not self.kinds.issuperset(ordered)
        self.kinds = set(ordered)
        if not self._given_order:
            self._order = ordered.copy
        if added:
            self.session.wake([self])

    def order(self) -> list[str]:
        return self._order()

    def capacity(self) -> tuple[int | None, int | None]:
        if self._capacity is not None:
            return self._capacity()
        if self.window is None:
            return None, None
        return self.window - len(self.held), self.window

    # -- the pacing policy -----------------------------------------------------------------

    def want(self, batch_size: int, now_ms: float | None = None) -> int:
        """How many rows to poll now; 0: not now (see the module docstring)."""
        if self.closed or not self.kinds:
            return 0
        due = self.next_due_ms
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        if not (self.wanted or self.backlog or (due is not None and due <= now_ms)
                or time.monotonic() - self.last_poll >= self.session.polling_interval):
            return 0
        room, window = self.capacity()
        if room is not None and (room <= 0 or self.backlog and window and room < refill(window)):
            return 0
        return batch_size if room is None else min(room, batch_size)

    def wait_s(self, now_ms: float | None = None) -> float:
        """Seconds until it polls without being woken: fallback or due time (skew floor)."""
        wait = self.session.polling_interval - (time.monotonic() - self.last_poll)
        room, _ = self.capacity()
        due = self.next_due_ms
        full = room is not None and room <= 0
        if due is not None and not full:
            now_ms = time.time() * 1000 if now_ms is None else now_ms
            wait = min(wait, max((due - now_ms) / 1000, SKEW_RETRY_S))
        if full and self.signal is None:  # nothing tells it of freed room: look again soon
            wait = min(wait, SKEW_RETRY_S * 10)
        return max(wait, 0.0)

    def polled(self, more: bool, next_due: int | None, error: Exception | None = None) -> None:
        """Learn from a poll: a full batch (``more``) leaves a backlog; an error polls again;
        the next due time arms the timer (one already past is retried after SKEW_RETRY_S)."""
        self.backlog = more and error is None
        if error is not None:
            self.wanted = True
        floor = int((time.time() + SKEW_RETRY_S) * 1000)
        self.next_due_ms = None if next_due is None else max(next_due, floor)

    def notify(self, now_at: bool, later_ms: int | None) -> bool:
        """A wake-up of its kinds: ``now_at`` a row is due now, ``later_ms`` one due later.
        Only a change wakes the waiter: a stream of sends does not wake it once each. True if
        its due time moved earlier (the loop's timer is armed again)."""
        woken = earlier = False
        if now_at and not self.wanted:
            self.wanted = woken = True
        if later_ms is not None and (self.next_due_ms is None or later_ms < self.next_due_ms):
            self.next_due_ms, earlier = later_ms, True
        if (woken or earlier) and self.signal is not None:
            self.signal()
        return earlier

    # -- leases ----------------------------------------------------------------------------

    def hold(self, envs: Iterable[Envelope]) -> None:
        with self.session.lock:
            for env in envs:
                self.held[(env.id, env.lock)] = env

    def _forget(self, deliveries: Iterable[Delivery], kinds: set[str] | None = None
                ) -> list[tuple[int, str]]:
        """Stop holding these; returns the ones that were held (a second settle is a no-op),
        and adds their kinds to ``kinds``. Wakes the waiter when the freed room is what it
        waits for: the first slot of a full window, or the refill of a backlog (waking on
        every settle cost a thread switch each)."""
        with self.session.lock:
            gone = []
            for key in map(_key, deliveries):
                env = self.held.pop(key, None)
                if env is not None:
                    gone.append(key)
                    if kinds is not None:
                        kinds.add(env.kind)
        if gone and self.signal is not None:
            room, window = self.capacity()
            if room is not None and (room == len(gone) or window and room == refill(window)):
                self.signal()
        return gone

    def locks(self) -> set[str]:
        with self.session.lock:
            return {lock for _, lock in self.held}


@dataclass(slots=True)
class Polled:
    """One subscription's poll: what it asked for, the rows to deliver, when to look again,
    and whether the statement filled the batch (more is due already)."""

    sub: Subscription
    want: int
    envs: list[Envelope]
    next_due: int | None
    more: bool


def refill(window: int) -> int:
    """The room a backlogged subscription waits for: half its window."""
    return max(window // 2, 1)


class Session:
    """See the module docstring. ``listen`` makes a LISTEN connection (None: never listen);
    ``misfired`` picks, of the rows a poll took, those to ack without delivering; ``jobs`` are
    (interval s, callable) the session's thread also runs (bindings heartbeat, retention);
    ``freeze_gc`` freezes the process' start-up heap when the session starts (see
    :func:`freeze_start_heap`)."""

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

    # -- wake-ups ----------------------------------------------------------------------------

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

    # -- the event-loop face ---------------------------------------------------------------

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

    # -- the session's thread: acks, leases, jobs (and LISTEN for threads) -----------------

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

    # -- settling ----------------------------------------------------------------------------

    def ack(self, sub: Subscription, deliveries: Iterable[Delivery]) -> None:
        """Delete these rows: within ACK_FLUSH_INTERVAL_S, at once past ``batch_size``; at
        once too when a concurrency limit counts them (by the session's thread), and then the
        consumers of their kinds are woken to take the freed slots (core/queue/controls.py)."""
        kinds: set[str] = set()
        gone = sub._forget(deliveries, kinds)
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
        gone = sub._forget(deliveries)
        sub.wanted = True
        if not gone:
            return 0
        return self.queue.release(gone, delay) if delay else self.queue.release(gone)

    def dead_letter(self, sub: Subscription, deliveries: Sequence[Delivery], to_kind: str,
                    retention_s: float, payloads: Sequence[bytes | None]) -> int:
        """Move held rows to ``to_kind`` at once (kept ``retention_s``, never polled), each with
        its payload (None keeps the stored one); a row no longer held is left alone."""
        by_key = dict(zip(map(_key, deliveries), payloads, strict=True))
        gone = sub._forget(by_key)
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
