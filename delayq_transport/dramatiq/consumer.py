"""Dramatiq consumers on the queue core, and the one background thread they share per broker.

A consumer hands the worker only rows that are due: ``DelayedQueue.poll`` acquires up to the
prefetch room in one statement and also returns when the next row of its kinds is due. Between
polls a consumer sleeps on an event that the :class:`Hub` sets when a NOTIFY says one of its
kinds has a due row, and it wakes by itself at that next due time (leases included, so a dead
worker's messages come back when their lease lapses). The hub also deletes acked rows in
batches, extends the lease of every row a consumer still holds, and expires dead letters.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable

from dramatiq.broker import Consumer, MessageProxy
from dramatiq.errors import DecodeError
from dramatiq.message import Message

from ..core import partitions
from ..core.errors import DatabaseError, DatabaseUnavailable, ListenUndeliverable
from ..core.listen import Listener
from ..core.timeutil import to_ms
from ..core.types import Envelope
from ..scheduling.misfire import misfired
from .names import EXCEPTION_OPTION, PERIODIC_OPTION, TRACEBACK_OPTION, canonical
from .ports import BrokerPort
from .registry import superseded

log = logging.getLogger(__name__)

#: How often the hub deletes acked rows (one statement per consumer with acks pending).
ACK_FLUSH_INTERVAL_S = 0.02
#: How often dead letters past their retention are deleted.
EXPIRE_INTERVAL_S = 60.0
#: After a timer finds nothing due (host and database clocks differ slightly), look again soon.
SKEW_RETRY_S = 0.005
#: A consumer answers notifications with at most one poll per this interval: under a stream of
#: sends every send notifies every worker process, and one poll per message per process spent
#: the CPU (two cores shared with PostgreSQL and the producers) that the producers needed. A
#: consumer whose last poll is older polls at once; due times (delayed messages, leases) are
#: not held back by it.
POLL_GAP_S = 0.020
#: The hub reads notifications at most once per this interval while they stream in (the first
#: one after a quiet interval is read at once): every send notifies every worker process, and
#: waking the hub thread once per send cost each process a select, a read and a GIL hand-off
#: per message. A consumer polls at most once per POLL_GAP_S anyway, so a batch read a few ms
#: later mostly joins the poll it would have joined; due times are the consumers' own timers.
NOTE_GAP_S = 0.010
#: Frames of a dead letter's traceback kept (Dramatiq's Retries keeps 30 too).
TRACEBACK_LIMIT = 30


class DelayqMessageProxy(MessageProxy):
    """A delivered message; ``envelope`` is the row it came from (its id and lock)."""

    def __init__(self, message: Message, envelope: Envelope) -> None:
        super().__init__(message)
        self.envelope = envelope


class DelayqConsumer(Consumer):
    """Iterates over the due messages of one queue (all its priority kinds)."""

    def __init__(self, broker: BrokerPort, queue_name: str, prefetch: int, timeout_ms: int):
        self.broker = broker
        self.queue_name = queue_name
        self.kinds = broker.kinds_for(queue_name)
        self.prefetch = max(int(prefetch), 1)
        #: On a backlog the next poll waits for this much room, not for POLL_GAP_S: each poll
        #: then takes a batch of at least half the prefetch, however fast the worker acks.
        self._refill = max(self.prefetch // 2, 1)
        self.timeout_s = max(timeout_ms, 0) / 1000
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._buffer: deque[Envelope] = deque()
        self._outstanding = 0          # buffered + handed to the worker, not yet acked
        self._held: dict[str, int] = {}  # lock -> deliveries still held under it
        self._handed: dict[int, Envelope] = {}  # row id -> handed to the worker, not settled
        self._pending_acks: list[Envelope] = []
        self._wanted = True            # poll soon (start-up, a notification)
        self._backlog = False          # the last poll filled the room: more is due already
        self._notes = 0                # notifications received: one during a poll re-arms it
        self._next_due_ms: float | None = None
        self._last_poll = 0.0
        self._closed = False
        broker.hub.register(self)

    # -- the iterator the ConsumerThread drives -------------------------------------------

    def __next__(self) -> MessageProxy | None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            env = self._next_buffered()
            if env is not None:
                proxy = self._proxy(env)
                if proxy is not None:
                    return proxy
                continue
            if self._should_poll() and self._poll():
                continue
            wait = self._wait_s(deadline)
            if wait <= 0:
                return None
            self.event.wait(wait)
            self.event.clear()

    def _next_buffered(self) -> Envelope | None:
        with self._lock:
            if not self._buffer:
                return None
            env = self._buffer.popleft()
            self._handed[env.id] = env
            return env

    def _room(self) -> int:
        with self._lock:
            return self.prefetch - self._outstanding

    def _should_poll(self) -> bool:
        room = self._room()
        if self._closed or room <= 0:
            return False
        since = time.monotonic() - self._last_poll
        if self._wanted and since >= POLL_GAP_S:
            return True
        if self._backlog and room >= self._refill:
            return True
        if since >= self.broker.polling_interval:
            return True
        due = self._next_due_ms
        return due is not None and due <= time.time() * 1000

    def _poll(self) -> bool:
        room = self._room()
        self._wanted = False
        notes = self._notes
        self._last_poll = time.monotonic()
        envs, next_due = self.broker.queue.poll(room, self.kinds)
        self._next_due_ms = next_due
        # A full batch: more may be due already. A notification during the poll: its row may
        # have committed after the statement's snapshot.
        self._backlog = len(envs) >= room
        self._wanted = self._notes != notes
        if not envs:
            return False
        with self._lock:
            self._buffer.extend(envs)
            self._outstanding += len(envs)
            lock = envs[0].lock
            self._held[lock] = self._held.get(lock, 0) + len(envs)
        return True

    def _wait_s(self, deadline: float) -> float:
        now = time.monotonic()
        wait = min(deadline - now, self.broker.polling_interval - (now - self._last_poll))
        room = self._room()
        if room <= 0:  # full: only an ack (which sets the event) lets it poll again
            return min(wait, deadline - now)
        if self._wanted:  # a notification held back until POLL_GAP_S after the last poll
            wait = min(wait, max(POLL_GAP_S - (now - self._last_poll), 0.0005))
        due = self._next_due_ms
        if due is not None:
            wait = min(wait, max((due - time.time() * 1000) / 1000, SKEW_RETRY_S))
        return min(wait, deadline - now)

    def _proxy(self, env: Envelope) -> DelayqMessageProxy | None:
        """Decode a row; a delayed one is handed over as the due message it now is."""
        try:
            message = Message.decode(env.payload)
        except DecodeError as exc:
            log.error("delayq: undecodable Dramatiq message in row %s, dead-lettering it: %s",
                      env.id, exc)
            self._dead_letter([env], [None])
            return None
        if message.queue_name != canonical(message.queue_name) or "eta" in message.options:
            options = {k: v for k, v in message.options.items() if k != "eta"}
            message = Message(canonical(message.queue_name), message.actor_name, message.args,
                              message.kwargs, options, message.message_id,
                              message.message_timestamp)
        if PERIODIC_OPTION in message.options and self._misfired(env, message):
            self._release_slot(env)
            self._pending(env)
            return None
        return DelayqMessageProxy(message, env)

    def _misfired(self, env: Envelope, message: Message) -> bool:
        info = message.options[PERIODIC_OPTION]
        now_ms = to_ms(self.broker.queue.now())
        return misfired(self.broker.queue, env.kind, info, now_ms) or superseded(info, now_ms)

    # -- ack / nack / requeue (called from worker threads) --------------------------------

    def ack(self, message: MessageProxy) -> None:
        env = _envelope(message)
        self._release_slot(env)
        self._pending(env)

    def nack(self, message: MessageProxy) -> None:
        env = _envelope(message)
        # Recorded before the row leaves the queue: ``join`` returns as soon as it sees the
        # queue empty, and ``fail_fast`` must then find this failure (recorded after the move,
        # a join polling in between returned without raising).
        exc = getattr(message, "_exception", None)
        self.broker.record_failure(self.queue_name, message, exc)
        self._dead_letter([env], [final_payload(message._message, exc)])

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        envs = [_envelope(m) for m in messages]
        for env in envs:
            self._release_slot(env)
        if envs:
            self.broker.queue.release(envs)

    def _dead_letter(self, envs: list[Envelope], payloads: list[bytes | None]) -> None:
        for env in envs:
            self._release_slot(env)
        partitions.dead_letter(self.broker.queue, envs, self.broker.dead_letter_kind(
            self.queue_name), self.broker.dead_message_ttl_s, payloads)

    def _pending(self, env: Envelope) -> None:
        with self._lock:
            self._pending_acks.append(env)

    def _release_slot(self, env: Envelope) -> None:
        with self._lock:
            if self._handed.pop(env.id, None) is None:
                return  # settled already (a second ack/nack of the same delivery)
            self._outstanding -= 1
            left = self._held.get(env.lock, 0) - 1
            if left > 0:
                self._held[env.lock] = left
            else:
                self._held.pop(env.lock, None)
            room = self.prefetch - self._outstanding
        # Only the room the consumer thread waits for wakes it: the first slot (it was full)
        # and the refill of a backlog. Waking it on every ack cost a thread switch per message.
        if room == 1 or room == self._refill:
            self.event.set()

    # -- called by the hub ------------------------------------------------------------------

    def flush_acks(self) -> None:
        with self._lock:
            acks, self._pending_acks = self._pending_acks, []
        if acks:
            try:
                self.broker.queue.ack_many(acks)
            except BaseException:
                with self._lock:
                    self._pending_acks[:0] = acks  # retried on the next flush
                raise

    def held_locks(self) -> set[str]:
        with self._lock:
            return set(self._held)

    def notify(self, at_ms: int | None) -> None:
        """A row of our kinds became available (``None``: poll now, notifications were lost).

        Only a change wakes the consumer thread: a consumer already waiting to poll wakes by
        itself at the end of its poll gap, so a stream of sends does not wake it once each.
        """
        self._notes += 1
        if at_ms is None or at_ms <= time.time() * 1000:
            if self._wanted:
                return
            self._wanted = True
        elif self._next_due_ms is None or at_ms < self._next_due_ms:
            self._next_due_ms = at_ms
        else:
            return
        self.event.set()

    def close(self) -> None:
        """Delete what was acked, give back everything else still held.

        Dramatiq closes a consumer after its worker threads stopped and requeued their work,
        so a delivery still unsettled here was never going to be processed by this consumer.
        """
        self._closed = True
        try:
            self.flush_acks()
            with self._lock:
                held = [*self._buffer, *self._handed.values()]
                self._buffer.clear()
                self._handed.clear()
                self._outstanding = 0
                self._held.clear()
            if held:
                self.broker.queue.release(held)
        finally:
            self.broker.hub.unregister(self)


class IdleConsumer(Consumer):
    """The consumer of a ``<queue>.DQ`` delay queue: always empty.

    Dramatiq's worker starts one per queue; delayed messages are rows of the queue itself that
    become due at their eta, so there is nothing here to move and no database traffic.
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_s = max(timeout_ms, 0) / 1000
        self._closed = threading.Event()

    def __next__(self) -> MessageProxy | None:
        self._closed.wait(self.timeout_s)
        return None

    def ack(self, message: MessageProxy) -> None:  # pragma: no cover - never delivers
        raise RuntimeError("the delay-queue consumer of delayq delivers nothing")

    nack = ack

    def close(self) -> None:
        self._closed.set()


def final_payload(message: Message, exc: BaseException | None) -> bytes:
    """The dead letter's payload: the message with its final failure in its options.

    Dramatiq's Retries writes ``traceback`` on each failure it handles, but not on one it
    aborts (``throws``) nor without Retries at all; the nack knows the exception in every case
    and writes its traceback and a one-line summary (``delayq_traceback``, ``delayq_exception``)
    for the dead-letter page, beside ``traceback`` as Retries left it. Done per failure only:
    acks never reach this.
    """
    if exc is None:
        return message.encode()
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__,
                                            limit=TRACEBACK_LIMIT))
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return message.copy(options={TRACEBACK_OPTION: tb, EXCEPTION_OPTION: summary[:1000]}).encode()


def _envelope(message: MessageProxy) -> Envelope:
    env = getattr(message, "envelope", None)
    if not isinstance(env, Envelope):
        raise TypeError(f"not a message delivered by the delayq broker: {message!r}")
    return env


class Hub:
    """One thread per broker: LISTEN wake-ups, batched acks, lease extension, retention."""

    def __init__(self, broker: BrokerPort) -> None:
        self.broker = broker
        self._consumers: set[DelayqConsumer] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: Listener | None = None
        #: LISTEN cannot deliver (a transaction pooler): poll instead, do not try again.
        self._unheard = False

    def register(self, consumer: DelayqConsumer) -> None:
        with self._lock:
            self._consumers.add(consumer)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="delayq-dramatiq-hub",
                                                daemon=True)
                self._thread.start()

    def unregister(self, consumer: DelayqConsumer) -> None:
        with self._lock:
            self._consumers.discard(consumer)

    def consumers(self) -> list[DelayqConsumer]:
        with self._lock:
            return list(self._consumers)

    def _run(self) -> None:
        next_lease = next_expire = next_acks = last_notes = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now - last_notes < NOTE_GAP_S:  # notifications are streaming: gather them
                    self._stop.wait(min(last_notes + NOTE_GAP_S, next_acks) - now)
                notes = self._wait_notes(max(next_acks - time.monotonic(), 0.0))
                if notes is None or notes:
                    self._dispatch(notes)
                    last_notes = time.monotonic()
                now = time.monotonic()
                if now < next_acks:
                    continue  # woken by a notification: acks wait for their interval
                next_acks = now + ACK_FLUSH_INTERVAL_S
                try:
                    self._flush_acks()
                    if now >= next_lease:
                        next_lease = now + self.broker.lease_s / 3
                        self._extend_leases()
                    if now >= next_expire:
                        next_expire = now + EXPIRE_INTERVAL_S
                        self.broker.expire_dead_letters()
                except (DatabaseUnavailable, DatabaseError) as exc:
                    log.warning("delayq: maintenance failed, will retry: %s", exc)
        finally:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def _wait_notes(self, timeout_s: float) -> list[tuple[str, int]] | None:
        """Notifications within ``timeout_s``; None when they may have been lost (a new or
        re-established LISTEN connection): every consumer then polls once."""
        listener = self._listener
        if self._unheard:  # LISTEN cannot deliver here: poll on the short interval
            self._stop.wait(min(timeout_s, self.broker.unheard_polling_interval))
            return None
        if listener is None or listener.closed:
            try:
                self._listener = Listener(self.broker.db, self.broker.queue.queries)
            except ListenUndeliverable as exc:
                log.log(logging.INFO if exc.expected else logging.WARNING, "delayq: %s", exc)
                self._unheard = True
                self.broker.queue.disable_watermarks()  # only NOTIFYs keep it sound
            except DatabaseUnavailable as exc:
                log.warning("delayq: LISTEN unavailable, polling until it is back: %s", exc)
                self._stop.wait(timeout_s)
            return None
        try:
            listener.wait(timeout_s)
            return listener.drain()
        except DatabaseUnavailable as exc:
            log.warning("delayq: %s; reconnecting", exc)
            listener.close()
            self._listener = None
            return None

    def _dispatch(self, notes: list[tuple[str, int]] | None) -> None:
        queue = self.broker.queue
        if notes is None:
            queue.reset_watermarks()  # notifications may be lost: polls scan from the bottom
        else:
            for kind, at in notes:
                queue.lower_watermark(kind, at)  # the next poll scans from below this row
        for consumer in self.consumers():
            if notes is None:
                consumer.notify(None)
                continue
            mine = [at for kind, at in notes if kind in consumer.kinds]
            if mine:
                consumer.notify(min(mine))

    def _flush_acks(self) -> None:
        for consumer in self.consumers():
            consumer.flush_acks()

    def _extend_leases(self) -> None:
        locks: set[str] = set()
        for consumer in self.consumers():
            locks |= consumer.held_locks()
        if locks:
            self.broker.queue.extend_lease(locks)

    def flush(self) -> None:
        """Delete every pending ack now (``join`` calls it so it does not wait for the timer)."""
        self._flush_acks()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._flush_acks()
