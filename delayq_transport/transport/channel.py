"""The kombu channel: storage primitives on the queue table, and the QoS that acks rows.

Routing and most of the AMQP surface come from kombu's virtual base; a channel implements the
primitives (``_put``, ``_get``, ``_purge``, ``_size``, ``_new_queue``, ``_has_queue``,
``_delete``), fanout through the shared bindings table, and the consumer side the transport's
poller drives (:meth:`DelayqChannel.plan_poll`, :meth:`~DelayqChannel.fetch`,
:meth:`~DelayqChannel.deliver`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import cache
from queue import Empty
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual
from kombu.transport.virtual.base import queue_declare_ok_t

from ..core.errors import DatabaseError, DatabaseUnavailable, InvalidInput
from ..core.joined import current
from ..core.types import Envelope
from . import message as msg
from .options import (
    CONTROL_EXCHANGE,
    DEFAULT_ACQUIRE_TIMEOUT_S,
    DEFAULT_BATCH_SIZE,
    DEFAULT_BINDING_TTL_S,
    DEFAULT_MAX_MESSAGE_BYTES,
)
from .poller import PollPlan

if TYPE_CHECKING:
    from .ports import TransportPort

log = logging.getLogger(__name__)

#: Bytes every beat occurrence's payload contains (its ``delayq_beat`` header).
_BEAT_MARK = b'"delayq_beat"'
_BEAT_HEADER = "delayq_beat"




@cache
def _misfire_check() -> Callable[..., bool]:
    """The scheduling engine's worker-side misfire policy (imported on the first beat
    occurrence: a worker that runs none never loads the engine)."""
    from ..scheduling.misfire import drop_misfired

    return drop_misfired


@cache
def _run_history() -> Callable[..., int]:
    """The engine's write of received occurrences to django-celery-beat's run history (beat
    in admin mode); imported with the misfire check."""
    from ..scheduling.djbeat import record_runs

    return record_runs


def _delivery_tag(env: Envelope) -> str:
    return f"{env.id}:{env.lock}"


def _parse_tag(tag: str) -> tuple[int, str]:
    row_id, _, lock = str(tag).partition(":")
    return int(row_id), lock




class QoS(virtual.QoS):
    """Acks delete rows (batched, from any thread); rejects and restores release them in place."""

    _delivered: OrderedDict[str, Any]  # type: ignore[assignment]
    channel: DelayqChannel

    def ack(self, delivery_tag: str) -> None:
        self.channel._forget(delivery_tag, ack=True)
        super().ack(delivery_tag)
        # Poll again once half the prefetch window is free: one poll then fills several slots,
        # and the messages still in the window keep the pool busy meanwhile.
        window = self.prefetch_count
        if not window or (self.can_consume_max_estimate() or 0) >= max(1, window // 2):
            self.channel.transport.wake(self.channel)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.channel._forget(delivery_tag, ack=not requeue)
        if requeue:
            self.channel.backend.queue.release([_parse_tag(delivery_tag)])
            self.channel.transport.wake(self.channel)
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Exception]:
        """Release every unacked delivery in one statement (no copies, unlike the base class)."""
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        for tag in tags:
            self.channel._forget(tag, ack=False)
        try:
            self.channel.backend.queue.release([_parse_tag(t) for t in tags])
        except (DatabaseUnavailable, DatabaseError) as exc:
            # The leases run out on their own: nothing is lost, only delayed.
            log.warning("delayq: could not release %d unacked message(s); they come back when "
                        "their lease ends: %s", len(tags), exc)
        return []



class DelayqChannel(virtual.Channel):
    """Storage primitives on the queue table; routing and QoS come from the virtual base."""

    QoS = QoS
    supports_fanout = True
    do_restore = True
    from_transport_options = virtual.Channel.from_transport_options + (  # type: ignore[assignment]
        "acquire_timeout", "batch_size", "max_message_size", "binding_ttl", "priority_steps",
        "durable_publish",
    )

    #: See the module docstring for each option.
    acquire_timeout = DEFAULT_ACQUIRE_TIMEOUT_S
    batch_size = DEFAULT_BATCH_SIZE
    max_message_size = DEFAULT_MAX_MESSAGE_BYTES
    binding_ttl = DEFAULT_BINDING_TTL_S
    priority_steps: Iterable[int] = msg.PRIORITY_STEPS
    durable_publish = False

    def __init__(self, connection: TransportPort, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.transport: TransportPort = connection
        self.backend = connection.backend
        self._held: dict[str, tuple[int, str]] = {}
        self._held_lock = threading.Lock()
        self._acks: list[tuple[int, str]] = []
        self._no_ack_queues: set[str] = set()
        self._auto_delete: set[str] = set()
        self._rotation = 0
        self._steps = tuple(int(s) for s in self.priority_steps)
        #: Poll this channel at the next chance. Kept per channel so a busy task queue does not
        #: drag the worker's quiet control queue into every poll (that doubled the statements).
        self.poll_wanted = True
        #: Earliest known scheduledAt (epoch ms) over this channel's kinds; None: none known.
        self.next_due_ms: int | None = None
        #: The last poll filled what it asked for: more messages are waiting (see plan_poll).
        self.backlog = False

    # -- kinds ---------------------------------------------------------------------------

    def _kinds(self, queue: str) -> list[str]:
        return msg.kinds_for(queue, self._steps)

    def consumed_kinds(self) -> set[str]:
        return {k for q in self._active_queues for k in self._kinds(q)}

    def _poll_kinds(self) -> list[str]:
        """Priority buckets first, queues rotated per poll so none starves at equal priority."""
        queues = list(dict.fromkeys(self._active_queues))
        if not queues:
            return []
        self._rotation = (self._rotation + 1) % len(queues)
        queues = queues[self._rotation :] + queues[: self._rotation]
        return [msg.kind_for(q, step, self._steps) for step in self._steps for q in queues]

    # -- storage primitives --------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        row = msg.row_of(queue, message, self._steps)
        if len(row.payload) > self.max_message_size:
            raise InvalidInput(
                f"message for queue {queue!r} is {len(row.payload)} bytes, over "
                f"max_message_size ({self.max_message_size}); pass large data by reference"
            )
        publisher = self.backend.publisher
        if publisher is not None:  # publish_linger: written with others within that time
            publisher.put(row.kind, row.key, row.payload, row.eta)
            return
        self.backend.queue_for(row.kind).offer(
            row.key, row.payload, row.eta, durable=bool(self.durable_publish)
        )

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        envs = self.backend.queue.try_poll_many(1, self._kinds(queue))
        if not envs:
            raise Empty()
        self.transport.ensure_maintenance()  # flushes this message's ack, extends its lease
        return self._to_message(envs[0], queue, ack_needed=True)

    def _purge(self, queue: str) -> int:
        self.backend.flush_publishes()
        return self.backend.queue.purge(self._kinds(queue))

    def _size(self, queue: str) -> int:
        """message_count: due rows only, exact up to a cap (docs/how-to/monitor.md)."""
        self.backend.flush_publishes()
        return self.backend.queue.count_due(self._kinds(queue))

    def _new_queue(self, queue: str, auto_delete: bool = False, **kwargs: Any) -> None:
        if auto_delete:
            self._auto_delete.add(queue)

    def queue_declare(self, queue: str | None = None, passive: bool = False,
                      **kwargs: Any) -> Any:
        """Inside the caller's transaction (core/joined.py), where Celery declares a task's
        queue on its first publish per connection, the queue is made and bound (the binding
        is written after the transaction: core/bindings.py) but its messages are not counted:
        the count would take a connection of delayq's own, or read up to 100,000 index
        entries inside the caller's transaction, for a number a publish does not read. Its
        declare-ok then says 0 messages; a passive declare (made to ask) counts as ever."""
        if passive or queue is None or current() is None:
            return super().queue_declare(queue, passive, **kwargs)
        self._new_queue(queue, **kwargs)
        return queue_declare_ok_t(queue, 0, 0)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        if queue in self.state.queue_index or self._size(queue):
            return True
        return self.backend.bindings.has_queue(queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)
        self.backend.bindings.forget_queue(queue)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        self.backend.bindings.bind(exchange, routing_key or "", queue, pattern or "",
                                   self.typeof(exchange).type, queue in self._auto_delete)

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        """Bindings from the database, so a producer routes to queues other processes bound."""
        rows = self.backend.bindings.routes(exchange, int(self.binding_ttl * 1000))
        local = self.state.exchanges.get(exchange, {}).get("table", [])
        return list(dict.fromkeys([*local, *rows]))

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str,
                    **kwargs: Any) -> None:
        if exchange == CONTROL_EXCHANGE:
            self._revoke_waiting(message)
        self.backend.bindings.broadcast(exchange, message["properties"]["delivery_tag"],
                                        msg.encode(message), int(self.binding_ttl * 1000))

    def _revoke_waiting(self, message: dict[str, Any]) -> None:
        """``revoke`` of a task that is still scheduled deletes its row: it never runs."""
        try:
            body = json.loads(self.decode_body(message["body"],
                                               message["properties"].get("body_encoding")))
        except (ValueError, TypeError, KeyError):
            return
        if not isinstance(body, dict) or body.get("method") != "revoke":
            return
        ids = (body.get("arguments") or {}).get("task_id")
        ids = [ids] if isinstance(ids, str) else [str(i) for i in ids or ()]
        if ids:
            deleted = self.backend.queue.delete_waiting(ids)
            if deleted:
                log.info("delayq: revoked %d scheduled task(s) before delivery", len(deleted))

    # -- consuming -------------------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        result = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.transport.consuming_started(self)
        return result

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._no_ack_queues.discard(queue)
        return result

    def _to_message(self, env: Envelope, queue: str, *, ack_needed: bool) -> dict[str, Any]:
        message = msg.decode(env.payload)
        props = message.setdefault("properties", {})
        props["delivery_tag"] = tag = _delivery_tag(env)
        props.setdefault("delivery_info", {})["redelivered"] = env.is_redelivery
        message["redelivered"] = env.is_redelivery
        if ack_needed:
            with self._held_lock:
                self._held[tag] = (env.id, env.lock)
        return message

    def plan_poll(self) -> PollPlan | None:
        """What this channel has room for; decided on the loop thread, which owns the QoS.

        Under a backlog on the worker's event loop, wait until half the prefetch window is
        free: refilling one or two slots per poll made a poll (a round trip, a statement and a
        thread hop) cost ~0.5 of a task; the half of the window still held keeps the pool busy
        meanwhile. Without a known backlog (a wake-up, a due time) any room is polled at once,
        so latency is unchanged."""
        if not self._active_queues or not self.qos.can_consume():
            return None
        room = self.qos.can_consume_max_estimate()
        window = self.qos.prefetch_count
        if (self.backlog and window and room is not None and room < max(1, window // 2)
                and self.transport.hub is not None):
            return None
        want = min(room or self.batch_size, self.batch_size)
        return PollPlan(self, want, self._poll_kinds(), frozenset(self._no_ack_queues))

    def fetch(self, plan: PollPlan) -> None:
        """Take due messages into the plan: database work only, so it may run off the loop
        thread (the consumer's state is touched by ``plan_poll`` and ``deliver`` alone)."""
        polled, plan.next_due = self.backend.queue.poll(plan.want, plan.kinds)
        plan.more = len(polled) == plan.want
        plan.envelopes = self._drop_misfired(polled)
        no_ack = [e for e in plan.envelopes if not plan.needs_ack(e)]
        if no_ack:
            self.backend.queue.ack_many(no_ack)  # no_ack: delivered means gone

    def deliver(self, plan: PollPlan) -> int:
        """Hand fetched messages to their consumers; a queue no longer consumed (cancelled, or
        the channel closed while the poll ran) gets its rows back at once, not after the lease."""
        active = set() if self.closed else set(self._active_queues)
        deliver = self.connection._deliver
        delivered, gone = 0, []
        for env in plan.envelopes:
            queue = msg.queue_of_kind(env.kind)[0]
            ack_needed = queue not in plan.no_ack
            if queue in active:
                deliver(self._to_message(env, queue, ack_needed=ack_needed), queue)
                delivered += 1
            elif ack_needed:
                gone.append(env)
        if gone:
            self.backend.queue.release(gone)
        return delivered

    def _drop_misfired(self, envs: list[Envelope]) -> list[Envelope]:
        """Beat occurrences that misfired while no worker ran follow their entry's policy, so a
        worker coming back before beat's next refresh does not run the whole backlog."""
        beat = [e for e in envs if _BEAT_MARK in e.payload]
        if not beat:
            return envs
        check, queue = _misfire_check(), self.backend.queue
        dropped, kept = [], []
        for env in beat:
            message = msg.decode(env.payload)
            if check(queue, env.kind, message):
                dropped.append(env)
            else:
                kept.append((env.key, (message.get("headers") or {}).get(_BEAT_HEADER)))
        _run_history()(queue, kept)  # entries of django-celery-beat's tables (admin mode)
        if not dropped:
            return envs
        queue.ack_many(dropped)
        gone = {e.id for e in dropped}
        return [e for e in envs if e.id not in gone]

    # -- acks and leases -------------------------------------------------------------------

    def _forget(self, tag: str, *, ack: bool) -> None:
        with self._held_lock:
            pair = self._held.pop(tag, None)
            if ack and pair is not None:
                self._acks.append(pair)
                flush_now = len(self._acks) >= self.batch_size
            else:
                flush_now = False
        if flush_now:
            self.flush_acks()

    def flush_acks(self) -> None:
        with self._held_lock:
            acks, self._acks = self._acks, []
        if acks:
            try:
                self.backend.queue.ack_many(acks)
            except (DatabaseUnavailable, DatabaseError):
                with self._held_lock:
                    self._acks[:0] = acks  # keep them for the next flush
                raise

    def consumed_queues(self) -> set[str]:
        """The queues this channel consumes (kombu's active queues)."""
        return set(self._active_queues)

    def held_locks(self) -> set[str]:
        with self._held_lock:
            return {lock for _, lock in self._held.values()}

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush_acks()
        except (DatabaseUnavailable, DatabaseError) as exc:
            log.warning("delayq: could not flush acks on close (they will be redelivered): %s",
                        exc)
        super().close()
        self.transport.channel_closed(self)

