"""delayq transport module for kombu: Celery's broker, with countdowns kept in PostgreSQL.

Features
========
* Type: Virtual
* Supports Direct: Yes
* Supports Topic: Yes
* Supports Fanout: Yes (bindings live in the database, copies go to queues consumed recently)
* Supports Priority: Yes, with the meaning of kombu's Redis transport: buckets 0, 3, 6, 9 and
  a *lower* number is served first
* Supports TTL: No (Celery's ``expires`` header is honoured by the worker)
* Supports ETA: Yes: a message's ``eta`` header becomes its row's ``scheduledAt``, so a worker
  only ever receives messages that are due

Connection String
=================
.. code-block::

    delayq+postgresql://[USER[:PASSWORD]@]HOST[:PORT]/DBNAME

``import delayq_transport`` (in the module that creates the Celery app) registers the scheme
with kombu; that is the one extra step next to changing ``broker_url``.

Transport Options
=================
Set through Celery's ``broker_transport_options`` (seconds for all durations):

* ``acquire_timeout``: lease of a delivered, unacknowledged message (default 60). A live
  consumer extends it every third of the lease; a dead one's messages come back after it.
* ``polling_interval``: fallback poll when no notification arrives (default 5).
* ``table``: queue table (default ``delayed_queue``).
* ``pool_size``: pooled connections per process (default 4), plus one LISTEN connection.
* ``batch_size``: most messages taken per poll (default 100; capped by prefetch).
* ``ack_flush_interval``: acks are deleted in batches at least this often (default 0.05).
* ``priority_steps``: priority buckets (default ``[0, 3, 6, 9]``).
* ``ensure_schema``: create/upgrade the schema on connect (default True).
* ``durable_publish``: a publish returns only once its row is flushed to disk (default
  False). Off, a publish returns once its row is committed, before the WAL flush: a clean
  PostgreSQL restart loses nothing, a PostgreSQL crash can lose the publishes of its last
  ~0.6 s (never a later one without the earlier ones). That is what Celery's default brokers
  give (Redis' default persistence, RabbitMQ without publisher confirms), at their speed; on
  costs one flush wait per publish (see docs/benchmarks.md).
* ``durable_acks``: commit acks, leases and releases with a WAL flush (default False). Off,
  they skip the flush wait, which unblocks the worker's event loop; a PostgreSQL crash can then
  only redeliver messages (at-least-once).
* ``low_watermark``: start each poll above the rows this worker already took, below which
  only dead index entries lie (default True; see docs/scale.md). NOTIFYs lower it.
* ``full_rescan_interval``: a poll scans each queue from the bottom at least this often, the
  safety net of the watermark (default 30).
* ``database_url``: libpq URL to use instead of the broker URL (e.g. a Unix socket).
* ``max_message_size``: bytes; larger messages are refused with a clear error (default 64 MiB).
* ``binding_ttl``: a fanout queue whose consumer has not been seen for this long receives no
  more broadcasts (default 60); auto-delete queues unseen for 10x this are removed.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cache
from queue import Empty, SimpleQueue
from typing import Any

import psycopg
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.utils.objects import cached_property

from ..core.db import Database
from ..core.errors import DatabaseError, DatabaseUnavailable, InvalidInput
from ..core.queue import DelayedQueue
from ..core.types import Envelope
from ..core.watermark import DEFAULT_FULL_RESCAN_INTERVAL_S
from . import message as msg

log = logging.getLogger(__name__)

TRANSPORT_ALIASES.setdefault("delayq", "delayq_transport.transport:Transport")

DEFAULT_ACQUIRE_TIMEOUT_S = 60.0
DEFAULT_POLLING_INTERVAL_S = 5.0
DEFAULT_BATCH_SIZE = 100
DEFAULT_POOL_SIZE = 4
DEFAULT_ACK_FLUSH_INTERVAL_S = 0.05
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_BINDING_TTL_S = 60.0
#: After a timer fires and finds nothing (clock skew between host and database), retry soon.
SKEW_RETRY_S = 0.005
#: How long closing waits for a poll in flight, to give its messages back at once.
DEFAULT_CLOSE_WAIT_S = 5.0
CONTROL_EXCHANGE = "celery.pidbox"



#: Bytes every beat occurrence's payload contains (its ``delayq_beat`` header).
_BEAT_MARK = b'"delayq_beat"'


@cache
def _misfire_check() -> Callable[..., bool] | None:
    """delayq_beat's worker-side misfire policy, if delayq_beat is installed (imported lazily:
    the transport must not pull in Celery beat at import time)."""
    try:
        from delayq_beat.misfire import drop_misfired
    except ImportError:
        return None
    return drop_misfired


def _delivery_tag(env: Envelope) -> str:
    return f"{env.id}:{env.lock}"


def _parse_tag(tag: str) -> tuple[int, str]:
    row_id, _, lock = str(tag).partition(":")
    return int(row_id), lock


@dataclass(slots=True)
class PollPlan:
    """One channel's share of a poll: made on the loop thread, filled in by the fetch."""

    channel: DelayqChannel
    want: int
    kinds: list[str]
    no_ack: frozenset[str]
    next_due: int | None = None
    more: bool = False
    envelopes: list[Envelope] = field(default_factory=list)

    def needs_ack(self, env: Envelope) -> bool:
        return msg.queue_of_kind(env.kind)[0] not in self.no_ack

    def held(self) -> list[Envelope]:
        """Fetched rows still leased to us (no_ack ones are already deleted)."""
        return [e for e in self.envelopes if self.needs_ack(e)]


#: A poll handed to the poller thread: its outcome (an error or None) and what it fills in.
PollJob = tuple[Future[Exception | None], list[PollPlan]]


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
            self.channel.transport._wake(self.channel)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.channel._forget(delivery_tag, ack=not requeue)
        if requeue:
            self.channel.backend.queue.release([_parse_tag(delivery_tag)])
            self.channel.transport._wake(self.channel)
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


class Backend:
    """What one process shares per database: the pool and the queue built on it.

    Celery opens several kombu connections per worker (consumer, events, control); sharing the
    pool keeps a worker at a handful of PostgreSQL connections. Keyed by pid, so a forked child
    never reuses its parent's sockets.
    """

    _registry: dict[tuple[int, str, str], Backend] = {}
    _registry_lock = threading.Lock()

    def __init__(self, url: str, options: dict[str, Any], key: tuple[int, str, str]) -> None:
        self.url = url
        self._key = key
        self.table = options.get("table", "delayed_queue")
        self.db = Database(url, max_size=int(options.get("pool_size", DEFAULT_POOL_SIZE)))
        try:
            self.queue = DelayedQueue(
                self.db,
                kind=msg.DEFAULT_QUEUE,
                table=self.table,
                acquire_timeout=float(options.get("acquire_timeout", DEFAULT_ACQUIRE_TIMEOUT_S)),
                ensure_schema=bool(options.get("ensure_schema", True)),
                relaxed_consumer_commits=not options.get("durable_acks", False),
                # issue 10: polls start at the consumer's low watermark (core/watermark.py);
                # this module feeds it every NOTIFY (_drain_notifications, _reset_listener).
                low_watermark=bool(options.get("low_watermark", True)),
                full_rescan_interval=float(options.get("full_rescan_interval",
                                                       DEFAULT_FULL_RESCAN_INTERVAL_S)),
            )
        except BaseException:
            self.db.close()
            raise
        self.users = 0
        self._by_kind: dict[str, DelayedQueue] = {}

    def queue_for(self, kind: str) -> DelayedQueue:
        """The queue of one kind, built once (publishing asks for it every time)."""
        queue = self._by_kind.get(kind)
        if queue is None:
            queue = self._by_kind[kind] = self.queue.with_kind(kind)
        return queue

    @classmethod
    def acquire(cls, url: str, options: dict[str, Any]) -> Backend:
        key = (os.getpid(), url, json.dumps(options, sort_keys=True, default=str))
        with cls._registry_lock:
            backend = cls._registry.get(key)
            if backend is None:
                backend = cls._registry[key] = Backend(url, options, key)
            backend.users += 1
            return backend

    def release(self) -> None:
        with self._registry_lock:
            self.users -= 1
            if self.users <= 0:
                self._registry.pop(self._key, None)
                self.db.close()

    @cached_property
    def q(self) -> Any:
        return self.queue.queries


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

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self.transport = connection
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
        payload = msg.encode(message)
        if len(payload) > self.max_message_size:
            raise InvalidInput(
                f"message for queue {queue!r} is {len(payload)} bytes, over max_message_size "
                f"({self.max_message_size}); pass large data by reference"
            )
        priority = message["properties"].get("priority")
        kind = msg.kind_for(queue, priority, self._steps)
        self.backend.queue_for(kind).offer(
            msg.row_key(message), payload, msg.eta_of(message), durable=bool(self.durable_publish)
        )

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        envs = self.backend.queue.try_poll_many(1, self._kinds(queue))
        if not envs:
            raise Empty()
        self.transport._ensure_maintenance()  # flushes this message's ack, extends its lease
        return self._to_message(envs[0], queue, ack_needed=True)

    def _purge(self, queue: str) -> int:
        return self.backend.queue.purge(self._kinds(queue))

    def _size(self, queue: str) -> int:
        return self.backend.queue.count_waiting(self._kinds(queue))

    def _new_queue(self, queue: str, auto_delete: bool = False, **kwargs: Any) -> None:
        if auto_delete:
            self._auto_delete.add(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        if queue in self.state.queue_index or self._size(queue):
            return True
        rows = self.backend.db.fetchall(self.backend.q["bindings_has_queue"], {"queue": queue})
        return bool(rows)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)
        self.backend.db.execute(self.backend.q["bindings_delete_queue"], {"queue": queue})

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        params = {
            "exchange": exchange,
            "routing_key": routing_key or "",
            "queue": queue,
            "pattern": pattern or "",
            "exchange_type": self.typeof(exchange).type,
            "auto_delete": queue in self._auto_delete,
            "now": None,
        }
        self.backend.db.execute(self.backend.q["bindings_upsert"], params)

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        """Bindings from the database, so a producer routes to queues other processes bound."""
        params = {"exchange": exchange, "live_ms": int(self.binding_ttl * 1000), "now": None}
        rows = self.backend.db.fetchall(self.backend.q["bindings_for_exchange"], params)
        local = self.state.exchanges.get(exchange, {}).get("table", [])
        return list(dict.fromkeys([*local, *(tuple(r) for r in rows)]))

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str,
                    **kwargs: Any) -> None:
        if exchange == CONTROL_EXCHANGE:
            self._revoke_waiting(message)
        params = {
            "key": message["properties"]["delivery_tag"],
            "payload": msg.encode(message),
            "exchange": exchange,
            "live_ms": int(self.binding_ttl * 1000),
            "now": None,
        }
        self.backend.db.execute(self.backend.q["fanout_insert"], params)

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
        self.transport._consuming_started(self)
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
        """What this channel has room for; decided on the loop thread, which owns the QoS."""
        if not self._active_queues or not self.qos.can_consume():
            return None
        want = min(self.qos.can_consume_max_estimate() or self.batch_size, self.batch_size)
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
        check = _misfire_check()
        if check is None:
            return envs
        queue = self.backend.queue
        dropped = [e for e in envs if _BEAT_MARK in e.payload
                   and check(queue, e.kind, msg.decode(e.payload))]
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
        self.transport._channel_closed(self)


class Transport(virtual.Transport):
    """kombu transport whose broker is a PostgreSQL table."""

    Channel = DelayqChannel
    channels: list[DelayqChannel]  # type: ignore[assignment]

    default_port = 5432  # type: ignore[assignment]
    driver_type = "postgresql"
    driver_name = "psycopg"
    polling_interval = DEFAULT_POLLING_INTERVAL_S
    ack_flush_interval = DEFAULT_ACK_FLUSH_INTERVAL_S

    connection_errors = virtual.Transport.connection_errors + (  # type: ignore[assignment]
        DatabaseUnavailable, psycopg.OperationalError, socket.error,
    )
    channel_errors = virtual.Transport.channel_errors + (DatabaseError,)  # type: ignore[assignment]

    implements = virtual.Transport.implements.extend(
        asynchronous=True,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        self.client = client
        options = dict(client.transport_options or {})
        self.options = options
        self.ack_flush_interval = float(options.get("ack_flush_interval",
                                                    DEFAULT_ACK_FLUSH_INTERVAL_S))
        self._url = options.get("database_url") or self._url_from_client(client)
        self._backend_opts = {k: options[k] for k in
                              ("table", "pool_size", "acquire_timeout", "ensure_schema",
                               "durable_acks")
                              if k in options}
        self._backend: Backend | None = None
        self._listener: psycopg.Connection[Any] | None = None
        self._listener_lock = threading.Lock()
        #: Kept apart: psycopg's fileno() raises once the connection broke, and the hub still
        #: needs the number to unregister it.
        self._listener_fd: int | None = None
        self._hub: Any = None
        self._hub_timer: Any = None
        self._kick: tuple[socket.socket, socket.socket] | None = None
        self._next_fallback = 0.0
        self._maintenance: threading.Thread | None = None
        self._poller: threading.Thread | None = None
        self._poll_jobs: SimpleQueue[PollJob | None] = SimpleQueue()
        self._inflight: PollJob | None = None
        self._stop = threading.Event()
        super().__init__(client, **kwargs)

    @staticmethod
    def _url_from_client(client: Any) -> str:
        """kombu keeps ``postgresql://...`` (after the ``delayq+`` prefix) as the hostname."""
        hostname = client.hostname or ""
        if "://" in hostname:
            return hostname
        user = client.userid or "postgres"
        password = f":{client.password}" if client.password else ""
        port = client.port or Transport.default_port
        db = (client.virtual_host or "postgres").strip("/") or "postgres"
        return f"postgresql://{user}{password}@{hostname or 'localhost'}:{port}/{db}"

    @property
    def backend(self) -> Backend:
        """Acquired on first use: kombu builds transports just to read ``connection_errors``."""
        if self._backend is None:
            self._backend = Backend.acquire(self._url, self._backend_opts)
        return self._backend

    @property
    def lease_s(self) -> float:
        return self.backend.queue.lease_ms / 1000

    def establish_connection(self) -> Any:
        self.backend  # noqa: B018 - connect now, so errors surface as connection errors
        return super().establish_connection()

    def driver_version(self) -> str:
        return psycopg.__version__

    # -- channel bookkeeping ---------------------------------------------------------------

    def _consuming(self) -> list[DelayqChannel]:
        return [c for c in self.channels if c._active_queues and not c.closed]

    def _consuming_started(self, channel: DelayqChannel) -> None:
        channel.poll_wanted = True
        self._ensure_listener()
        self._ensure_maintenance()
        self._touch_bindings()

    def _channel_closed(self, channel: DelayqChannel) -> None:
        if not self._consuming():
            self._close_listener()

    def _wake(self, channel: DelayqChannel | None = None) -> None:
        """Poll ``channel`` (default: every channel) at the next chance."""
        for c in self.channels if channel is None else (channel,):
            c.poll_wanted = True

    # -- polling (shared by the event loop and drain_events) ------------------------------

    def _plans(self) -> list[PollPlan] | None:
        """What each channel that wants a poll has room for; None if none has. A channel with
        a full prefetch window stays wanted: it is polled as soon as an ack frees room."""
        plans = []
        for channel in self._consuming():
            if channel.poll_wanted and (plan := channel.plan_poll()) is not None:
                channel.poll_wanted = False
                plans.append(plan)
        return plans or None

    @staticmethod
    def _fetch(plans: list[PollPlan]) -> Exception | None:
        """Run the plans' statements. An error stops the pass but is returned, not raised, so
        what the earlier plans took is still delivered rather than left to its lease."""
        for plan in plans:
            try:
                plan.channel.fetch(plan)
            except Exception as exc:
                return exc
        return None

    def _deliver_polled(self, plans: list[PollPlan], error: Exception | None) -> int:
        """Deliver fetched messages and learn when to look again. When the queues are drained,
        the next due time arms a timer instead of a poll loop; a due time already past
        (host/database clock skew) is retried shortly."""
        delivered = 0
        floor = int((time.time() + SKEW_RETRY_S) * 1000)
        for plan in plans:
            channel = plan.channel
            delivered += channel.deliver(plan)
            if plan.more or error is not None:
                channel.poll_wanted = True
            else:
                channel.next_due_ms = None if plan.next_due is None else max(plan.next_due, floor)
        if error is not None:
            raise error
        return delivered

    def _poll_once(self) -> int | None:
        """One synchronous pass (``drain_events``); None if no channel had room."""
        plans = self._plans()
        if plans is None:
            return None
        return self._deliver_polled(plans, self._fetch(plans))

    # -- polling off the event loop --------------------------------------------------------
    #
    # A poll statement takes a millisecond or two; run on the hub it would stall everything
    # else the worker's loop does (feeding the pool, acks, timers). So the loop thread plans
    # the poll (QoS is its own), a poller thread runs the statement, and the result comes
    # back through the wake-up socket to be delivered on the loop thread. One poll at a time:
    # the window it was planned for cannot shrink meanwhile, only grow as acks come in.

    def _start_poll(self) -> None:
        plans = self._plans()
        if plans is None:
            return
        future: Future[Exception | None] = Future()
        self._inflight = (future, plans)
        if self._poller is None or not self._poller.is_alive():
            self._poll_jobs = SimpleQueue()  # a stopped poller's queue may hold its stop mark
            self._poller = threading.Thread(target=self._run_poller, args=(self._poll_jobs,),
                                            name="delayq-poller", daemon=True)
            self._poller.start()
        self._poll_jobs.put((future, plans))

    def _run_poller(self, jobs: SimpleQueue[PollJob | None]) -> None:
        while (job := jobs.get()) is not None:
            future, plans = job
            future.set_result(self._fetch(plans))
            self._kick_loop()

    def _kick_loop(self) -> None:
        kick = self._kick
        if kick is not None:
            try:
                kick[1].send(b"\0")
            except OSError:  # closed meanwhile, or already full of wake-ups
                pass

    def _finish_poll(self) -> None:
        """On the loop thread: deliver what the poller fetched."""
        inflight = self._inflight
        if inflight is None or not inflight[0].done():
            return
        self._inflight = None
        future, plans = inflight
        self._deliver_polled(plans, future.result())
        self._schedule_hub_timer()

    def _abandon_poll(self) -> None:
        """Closing: give back what an unfinished poll takes, so it is not held for a lease."""
        inflight, self._inflight = self._inflight, None
        if self._poller is not None:
            self._poll_jobs.put(None)
            self._poller = None
        if inflight is None:
            return
        future, plans = inflight
        try:
            future.result(timeout=DEFAULT_CLOSE_WAIT_S)
            self.backend.queue.release([e for p in plans for e in p.held()])
        except (TimeoutError, DatabaseUnavailable, DatabaseError) as exc:
            log.warning("delayq: a poll in flight at close could not be undone; its messages "
                        "come back when their lease ends: %s", exc)

    def _seconds_until_due(self) -> float | None:
        dues = [c.next_due_ms for c in self._consuming() if c.next_due_ms is not None]
        return min(dues) / 1000 - time.time() if dues else None

    def _should_poll(self) -> bool:
        """Whether some channel wants a poll: woken, due, or the fallback interval is up."""
        if self._inflight is not None:
            return False
        now = time.monotonic()
        if now >= self._next_fallback:
            self._next_fallback = now + self.polling_interval
            self._wake()
        now_ms = time.time() * 1000
        wanted = False
        for channel in self._consuming():
            if channel.next_due_ms is not None and channel.next_due_ms <= now_ms:
                channel.poll_wanted, channel.next_due_ms = True, None
            wanted = wanted or channel.poll_wanted
        return wanted

    def drain_events(  # type: ignore[override]
        self, connection: Any, timeout: float | None = None
    ) -> None:
        """Blocking consume without an event loop: wait on NOTIFY, the due timer or fallback."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._drain_notifications()
            full = False
            if self._should_poll():
                delivered = self._poll_once()
                if delivered:
                    return
                full = delivered is None
            waits = [SKEW_RETRY_S * 10 if full else self._next_fallback - time.monotonic()]
            due = self._seconds_until_due()
            if due is not None:
                waits.append(due)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                waits.append(remaining)
            self._wait_readable(max(min(waits), 0.0))

    def _wait_readable(self, timeout: float) -> None:
        listener = self._listener
        if listener is None or listener.closed:
            self._stop.wait(timeout)
            return
        try:
            select.select([listener.fileno()], [], [], timeout)
        except (OSError, ValueError):
            self._reset_listener()

    # -- LISTEN/NOTIFY ---------------------------------------------------------------------

    def _ensure_listener(self) -> None:
        with self._listener_lock:
            if self._listener is not None and not self._listener.closed:
                return
            conn = self.backend.db.connect()
            conn.execute(self.backend.q["listen"])
            self._listener, self._listener_fd = conn, conn.fileno()
        if self._hub is not None:
            self._hub.add_reader(self._listener_fd, self._on_readable)

    def _close_listener(self) -> None:
        with self._listener_lock:
            conn, self._listener = self._listener, None
            fd, self._listener_fd = self._listener_fd, None
        if self._hub is not None and fd is not None:
            try:
                self._hub.remove(fd)
            except (OSError, ValueError, KeyError):
                pass
        if conn is not None:
            conn.close()

    def _reset_listener(self) -> None:
        """The LISTEN connection broke (server restart): reconnect, and poll for what we missed."""
        self._close_listener()
        self.backend.queue.reset_watermarks()  # notifications were missed: rescan (issue 10)
        self._wake()
        if self._consuming():
            try:
                self._ensure_listener()
            except DatabaseUnavailable as exc:
                log.warning("delayq: LISTEN connection lost, polling until it is back: %s", exc)

    def _drain_notifications(self) -> None:
        listener = self._listener
        if listener is None:
            return
        try:
            notes = list(listener.notifies(timeout=0))
        except psycopg.Error:
            self._reset_listener()
            return
        if not notes:
            return
        consumers = [(c, c.consumed_kinds()) for c in self._consuming()]
        now_ms = time.time() * 1000
        for note in notes:
            kind, _, at = note.payload.rpartition(":")
            at_ms = int(at)
            self.backend.queue.lower_watermark(kind, at_ms)  # issue 10: poll from below it
            for channel, kinds in consumers:
                if kind not in kinds:
                    continue
                if at_ms <= now_ms:
                    channel.poll_wanted = True
                elif channel.next_due_ms is None or at_ms < channel.next_due_ms:
                    channel.next_due_ms = at_ms
                    self._schedule_hub_timer()

    # -- kombu event loop (Celery's async worker loop) -------------------------------------

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        self._hub = loop
        if self._kick is None:
            self._kick = socket.socketpair()
            for sock in self._kick:
                sock.setblocking(False)
        loop.add_reader(self._kick[0].fileno(), self._on_kick)
        loop.on_tick.add(self._on_tick)
        loop.call_repeatedly(self.polling_interval, self._wake)
        if self._listener_fd is not None:
            loop.add_reader(self._listener_fd, self._on_readable)

    def _on_kick(self) -> None:
        try:
            self._kick[0].recv(4096)  # type: ignore[index]
        except BlockingIOError:
            pass
        self._finish_poll()

    def _on_readable(self) -> None:
        self._drain_notifications()

    def _on_tick(self) -> None:
        if not self._consuming() or not self._should_poll():
            return
        if self._listener is None:
            self._reset_listener()  # LISTEN was lost and could not be re-established yet
        self._start_poll()

    def _schedule_hub_timer(self) -> None:
        """Wake the loop exactly when the earliest known message becomes due."""
        hub, wait = self._hub, self._seconds_until_due()
        if hub is None or wait is None:
            return
        if self._hub_timer is not None:
            self._hub_timer.cancel()
        # Nothing to do when it fires: the loop comes round and _should_poll sees who is due.
        self._hub_timer = hub.call_later(max(wait, SKEW_RETRY_S), lambda: None)

    # -- background maintenance: ack flush, lease extension, binding heartbeat ------------

    def _ensure_maintenance(self) -> None:
        if self._maintenance is None or not self._maintenance.is_alive():
            self._stop.clear()
            self._maintenance = threading.Thread(
                target=self._maintain, name="delayq-maintenance", daemon=True
            )
            self._maintenance.start()

    def _maintain(self) -> None:
        """Runs beside the consumer so a long task (even on the solo pool) keeps its lease."""
        next_lease = next_touch = next_janitor = 0.0
        while not self._stop.wait(self.ack_flush_interval):
            now = time.monotonic()
            try:
                for channel in list(self.channels):
                    channel.flush_acks()
                if now >= next_lease:
                    next_lease = now + self.lease_s / 3
                    self._extend_leases()
                if now >= next_touch:
                    next_touch = now + DEFAULT_BINDING_TTL_S / 4
                    self._touch_bindings()
                if now >= next_janitor:
                    next_janitor = now + DEFAULT_BINDING_TTL_S
                    self._janitor()
            except (DatabaseUnavailable, DatabaseError) as exc:
                log.warning("delayq: maintenance failed, will retry: %s", exc)

    def _extend_leases(self) -> None:
        locks: set[str] = set()
        for channel in list(self.channels):
            locks |= channel.held_locks()
        if locks:
            self.backend.queue.extend_lease(locks)

    def _touch_bindings(self) -> None:
        queues = sorted({q for c in self._consuming() for q in c._active_queues})
        if queues:
            self.backend.db.execute(self.backend.q["bindings_touch"],
                                    {"queues": queues, "now": None})

    def _janitor(self) -> None:
        params = {"stale_ms": int(DEFAULT_BINDING_TTL_S * 10 * 1000), "now": None}
        self.backend.db.execute(self.backend.q["janitor_transient_queues"], params)

    # -- lifecycle -------------------------------------------------------------------------

    def close_connection(self, connection: Any) -> None:
        try:
            self._abandon_poll()
            super().close_connection(connection)
        finally:
            self._stop.set()
            maintenance = self._maintenance
            if maintenance is not None and maintenance is not threading.current_thread():
                maintenance.join(timeout=5)
            self._close_listener()
            if self._kick is not None:
                if self._hub is not None:
                    self._hub.remove(self._kick[0].fileno())
                for sock in self._kick:
                    sock.close()
                self._kick = None
            backend, self._backend = self._backend, None
            if backend is not None:
                backend.release()
