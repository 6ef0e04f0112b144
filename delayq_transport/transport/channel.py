"""The kombu channel: storage primitives on the queue table, and the QoS that acks rows.

Routing and most of the AMQP surface come from kombu's virtual base; a channel implements the
primitives (``_put``, ``_get``, ``_purge``, ``_size``, ``_new_queue``, ``_has_queue``,
``_delete``), fanout through the shared bindings table, and the consumer side the transport's
transport's consumer session (core/queue/session.py) drives: each channel is one subscription of
it, and :meth:`DelayqChannel.deliver` hands its polled rows to kombu.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from queue import Empty
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual
from kombu.transport.virtual.base import queue_declare_ok_t

from ..core import DatabaseError, DatabaseUnavailable, InvalidInput
from ..core.queue import DelayedQueue, Envelope, Subscription, current
from ..formats import celery as msg
from ..formats import deadletters
from .options import (
    CONTROL_EXCHANGE,
    DEFAULT_ACQUIRE_TIMEOUT_S,
    DEFAULT_BATCH_SIZE,
    DEFAULT_BINDING_TTL_S,
    DEFAULT_MAX_MESSAGE_BYTES,
)

if TYPE_CHECKING:
    from .ports import TransportPort

log = logging.getLogger(__name__)

#: Bytes every beat occurrence's payload contains (its ``delayq_beat`` header).
_BEAT_MARK = b'"delayq_beat"'
_BEAT_HEADER = "delayq_beat"




def misfired_beats(queue: DelayedQueue) -> Callable[[list[Envelope]], list[Envelope]]:
    """The session's misfire predicate (core/queue/session.py): the scheduling engine's, for beat
    occurrences (the engine is imported on the first one: a worker that runs none never loads
    it)."""
    def misfired(envs: list[Envelope]) -> list[Envelope]:
        if not any(_BEAT_MARK in e.payload for e in envs):
            return []
        from ..scheduling.misfire import dropped

        return dropped(queue, envs, _beat_header)
    return misfired


def _beat_header(payload: bytes) -> object:
    """A beat occurrence's ``delayq_beat`` header (None: not one, or not a message)."""
    if _BEAT_MARK not in payload:
        return None
    try:
        return (msg.decode(payload).get("headers") or {}).get(_BEAT_HEADER)
    except (ValueError, TypeError, AttributeError):
        return None  # not decodable: delivered, and kombu reports it


def _pair(tag: str) -> tuple[int, str]:
    """(row id, lock) of a delivery tag ``<id>:<lock>:<queue>`` (a lock has no colon)."""
    row_id, _, rest = str(tag).partition(":")
    return int(row_id), rest.partition(":")[0]


class QoS(virtual.QoS):
    """Acks delete rows (batched by the session, from any thread); a requeue and a restore
    release them in place; a reject without requeue keeps the row as a dead letter
    (formats/deadletters.py)."""

    _delivered: OrderedDict[str, Any]  # type: ignore[assignment]
    channel: DelayqChannel

    def ack(self, delivery_tag: str) -> None:
        super().ack(delivery_tag)  # first: the room the session reads is then free
        self.channel.settle([delivery_tag], ack=True)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            self.channel.settle([delivery_tag], ack=False)
        else:
            self.channel.dead_letter(delivery_tag)
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Exception]:
        """Release every unacked delivery in one statement (no copies, unlike the base class)."""
        self._flush()
        tags = list(self._delivered)
        self._delivered.clear()
        try:
            self.channel.settle(tags, ack=False)
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
        "durable_publish", "dead_letter_retention",
    )

    #: See the module docstring for each option.
    acquire_timeout = DEFAULT_ACQUIRE_TIMEOUT_S
    batch_size = DEFAULT_BATCH_SIZE
    max_message_size = DEFAULT_MAX_MESSAGE_BYTES
    binding_ttl = DEFAULT_BINDING_TTL_S
    priority_steps: Iterable[int] = msg.PRIORITY_STEPS
    durable_publish = False
    dead_letter_retention = deadletters.DEFAULT_RETENTION_S

    def __init__(self, connection: TransportPort, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.transport: TransportPort = connection
        self.backend = connection.backend
        self._no_ack_queues: set[str] = set()
        self._auto_delete: set[str] = set()
        self._rotation = 0
        self._steps = tuple(int(s) for s in self.priority_steps)
        #: This channel's share of the transport's consumer session (core/queue/session.py), made
        #: on the first consume or get. One per channel, so a busy task queue does not drag
        #: the worker's quiet control queue into every poll (that doubled the statements).
        self._sub: Subscription | None = None

    # -- kinds ---------------------------------------------------------------------------

    def _kinds(self, queue: str) -> list[str]:
        return msg.kinds_for(queue, self._steps)

    @property
    def subscription(self) -> Subscription:
        if self._sub is None:
            self._sub = self.transport.session.subscribe(
                (), capacity=self._capacity, deliver=self.deliver, order=self._poll_kinds,
                keep=lambda env: msg.queue_of_kind(env.kind)[0] not in self._no_ack_queues)
        return self._sub

    def _capacity(self) -> tuple[int | None, int | None]:
        """(room, window) of the prefetch window: the QoS is the loop thread's own."""
        qos = self.qos
        return (qos.can_consume_max_estimate() if qos.can_consume() else 0,
                qos.prefetch_count or None)

    def consumed_kinds(self) -> set[str]:
        """The kinds of the queues this channel consumes (`celery inspect scheduled` lists them)."""
        return {k for q in self._active_queues for k in self._kinds(q)}

    def _consumed(self) -> None:
        self.subscription.set_kinds(self.consumed_kinds())

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
        envs = self.transport.session.fetch(self.subscription, 1, self._kinds(queue)).envs
        if not envs:
            raise Empty()
        return self._to_message(envs[0], queue)

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
        """Inside the caller's transaction (core/queue/joined.py), where Celery declares a task's
        queue on its first publish per connection, the queue is made and bound (the binding
        is written after the transaction: core/integrations/bindings.py) but its messages are not
        counted: the count would take a connection of delayq's own, or read up to 100,000 index
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
        deadletters.refuse_queue(queue)
        if no_ack:
            self._no_ack_queues.add(queue)
        result = super().basic_consume(queue, no_ack, *args, **kwargs)
        self._consumed()
        self.transport.consuming_started()
        return result

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._no_ack_queues.discard(queue)
        self._consumed()
        return result

    def _to_message(self, env: Envelope, queue: str) -> dict[str, Any]:
        message = msg.decode(env.payload)
        props = message.setdefault("properties", {})
        props["delivery_tag"] = f"{env.id}:{env.lock}:{queue}"  # the queue: for a reject
        props.setdefault("delivery_info", {})["redelivered"] = env.is_redelivery
        message["redelivered"] = env.is_redelivery
        return message

    def deliver(self, sub: Subscription, envs: list[Envelope]) -> int:
        """Hand polled rows to their consumers (on the loop thread); a queue no longer
        consumed (cancelled, or the channel closed while the poll ran) gets its rows back at
        once, not after the lease."""
        active = set() if self.closed else set(self._active_queues)
        deliver = self.connection._deliver
        delivered, gone = 0, []
        for env in envs:
            queue = msg.queue_of_kind(env.kind)[0]
            if queue in active:
                deliver(self._to_message(env, queue), queue)
                delivered += 1
            else:
                gone.append(env)
        if gone:
            self.transport.session.release(sub, gone)
        return delivered

    def settle(self, tags: list[str], *, ack: bool) -> None:
        if self._sub is None or not tags:
            return
        pairs = [_pair(t) for t in tags]
        if ack:
            self.transport.session.ack(self._sub, pairs)
        else:
            self.transport.session.release(self._sub, pairs)

    def dead_letter(self, tag: str) -> None:
        """A reject without requeue: the row moves to its queue's dead-letter kind, kept
        ``dead_letter_retention`` seconds (0: deleted, as an ack)."""
        if self._sub is None:
            return
        retention = float(self.dead_letter_retention)
        if retention <= 0:
            self.settle([tag], ack=True)
            return
        queue = str(tag).split(":", 2)[2]
        self.transport.session.dead_letter(self._sub, [_pair(tag)],
                                           deadletters.celery_kind(queue), retention, [None])
        log.warning("delayq: message %s of queue %r rejected: kept as a dead letter for %g s "
                    "(`delayq tasks dead-letters list`)", tag.partition(":")[0], queue,
                    retention)

    def consumed_queues(self) -> set[str]:
        """The queues this channel consumes (kombu's active queues)."""
        return set(self._active_queues)

    def close(self) -> None:
        if self.closed:
            return
        super().close()  # restores (releases) what was delivered and not acked
        if self._sub is not None:
            try:
                self.transport.session.unsubscribe(self._sub)
            except (DatabaseUnavailable, DatabaseError) as exc:
                log.warning("delayq: could not settle on close (acked messages may be "
                            "redelivered, the rest come back when their lease ends): %s", exc)

