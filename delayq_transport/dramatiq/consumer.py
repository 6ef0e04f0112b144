"""Dramatiq consumers: thin adapters on the broker's consumer session (core/queue/session.py).

A consumer is one subscription of the session: it takes due rows only (the session polls up
to its prefetch room and learns when the next row is due), waits on an event the session sets
when a wake-up, a due time or freed room concerns it, and settles through the session, which
batches acks, extends the leases of everything held and drops misfired periodic occurrences.
What is Dramatiq's own stays here: decoding, dead-lettering a failure with its traceback.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable

from dramatiq.broker import Consumer, MessageProxy
from dramatiq.errors import DecodeError
from dramatiq.message import Message

from ..core.queue import Envelope
from ..formats.dramatiq import EXCEPTION_OPTION, PERIODIC_OPTION, TRACEBACK_OPTION, canonical
from ..scheduling.misfire import dropped
from .ports import BrokerPort
from .registry import superseded

log = logging.getLogger(__name__)

#: Frames of a dead letter's traceback kept (Dramatiq's Retries keeps 30 too).
TRACEBACK_LIMIT = 30
#: Bytes every periodic occurrence's payload contains (its option's name).
_PERIODIC_MARK = f'"{PERIODIC_OPTION}"'.encode()


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
        self.timeout_s = max(timeout_ms, 0) / 1000
        self.event = threading.Event()
        self._buffer: deque[Envelope] = deque()
        self.session = broker.session
        self.sub = self.session.subscribe(broker.kinds_for(queue_name),
                                          window=max(int(prefetch), 1), signal=self.event.set)

    def __next__(self) -> MessageProxy | None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self._buffer:
                proxy = self._proxy(self._buffer.popleft())
                if proxy is not None:
                    return proxy
                continue
            if self.sub.closed:
                return None
            self._buffer.extend(self.session.poll(self.sub))
            if self._buffer:
                continue
            wait = min(self.sub.wait_s(), deadline - time.monotonic())
            if wait <= 0:
                return None
            self.event.wait(wait)
            self.event.clear()

    def _proxy(self, env: Envelope) -> DelayqMessageProxy | None:
        """Decode a row; a delayed one is handed over as the due message it now is."""
        try:
            message = Message.decode(env.payload)
        except DecodeError as exc:
            log.error("delayq: undecodable Dramatiq message in row %s, dead-lettering it: %s",
                      env.id, exc)
            self._dead_letter(env, None)
            return None
        if message.queue_name != canonical(message.queue_name) or "eta" in message.options:
            options = {k: v for k, v in message.options.items() if k != "eta"}
            message = Message(canonical(message.queue_name), message.actor_name, message.args,
                              message.kwargs, options, message.message_id,
                              message.message_timestamp)
        return DelayqMessageProxy(message, env)

    def ack(self, message: MessageProxy) -> None:
        self.session.ack(self.sub, [_envelope(message)])

    def nack(self, message: MessageProxy) -> None:
        # Recorded before the row leaves the queue: ``join`` returns as soon as it sees the
        # queue empty, and ``fail_fast`` must then find this failure (recorded after the move,
        # a join polling in between returned without raising).
        exc = getattr(message, "_exception", None)
        self.broker.record_failure(self.queue_name, message, exc)
        self._dead_letter(_envelope(message), final_payload(message._message, exc))

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        self.session.release(self.sub, [_envelope(m) for m in messages])

    def _dead_letter(self, env: Envelope, payload: bytes | None) -> None:
        self.session.dead_letter(self.sub, [env], self.broker.dead_letter_kind(self.queue_name),
                                 self.broker.dead_message_ttl_s, [payload])

    def close(self) -> None:
        """Delete what was acked, give back everything else still held.

        Dramatiq closes a consumer after its worker threads stopped and requeued their work,
        so a delivery still unsettled here was never going to be processed by this consumer.
        """
        self._buffer.clear()
        self.session.unsubscribe(self.sub)


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


def misfired_periodic(broker: BrokerPort) -> Callable[[list[Envelope]], list[Envelope]]:
    """The session's misfire predicate: the scheduling engine's, for periodic occurrences
    (with :func:`~.registry.superseded` for headers older than ``next_ms``)."""
    return lambda envs: dropped(broker.queue, envs, _periodic_header, superseded=superseded)


def _periodic_header(payload: bytes) -> object:
    """A periodic occurrence's ``delayq_periodic`` option (None: not one, or not decodable:
    dead-lettered when handed over)."""
    if _PERIODIC_MARK not in payload:
        return None
    try:
        return Message.decode(payload).options.get(PERIODIC_OPTION)
    except DecodeError:
        return None
