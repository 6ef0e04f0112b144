"""``DelayqBroker``: a Dramatiq broker whose messages are rows of the delayq table.

Features
========
* Any delay (days, months): a delayed message is a row whose ``scheduledAt`` is its eta. A
  worker only ever receives due messages; nothing is prefetched into memory before it is due,
  and nothing is moved from a delay queue when it becomes due (no extra write, no duplicate).
* Acks delete by (id, lock), in batches; nacks move the row to ``dramatiq:<queue>.XQ`` (dead
  letters, kept ``dead_message_ttl`` ms, listable with :meth:`DelayqBroker.dead_letters_of`).
* A delivered message is leased (``acquire_timeout``), the lease is extended while the worker
  lives; a killed worker's messages come back when the lease lapses.
* ``broker_priority`` (with ``max_priority``, as on RabbitMQ): higher is served first.
* LISTEN/NOTIFY wake-ups: a sent message reaches an idle worker without a polling delay.

Connection
==========
``DelayqBroker(url="postgresql://user@host/db")`` or ``DelayqBroker(database=Database(...))``;
``DELAYQ_DATABASE_URL`` is used when neither is given.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import defaultdict, deque
from datetime import timedelta
from typing import Any

from dramatiq.broker import Broker, Consumer, MessageProxy
from dramatiq.common import current_millis, dq_name
from dramatiq.errors import QueueJoinTimeout, QueueNotFound
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from ..core import InvalidInput, SchemaMissing
from ..core.db import Database, mask_password
from ..core.queue import (
    DelayedQueue,
    Listener,
    PublishBuffer,
    Session,
    check_linger,
    count_all,
    from_ms,
    list_kinds,
)
from ..core.schema import DEFAULT_SCHEMA_WAIT_S, wait_for_schema
from ..formats import deadletters, queues
from ..formats import dramatiq as names
from .consumer import DelayqConsumer, IdleConsumer, misfired_periodic

log = logging.getLogger(__name__)

DEFAULT_ACQUIRE_TIMEOUT_S = 60.0
DEFAULT_POLLING_INTERVAL_S = 5.0
#: Dramatiq's default for dead letters (RabbitMQ and Redis brokers, and delayq's policy,
#: formats/deadletters.py): 7 days, in ms.
DEFAULT_DEAD_MESSAGE_TTL_MS = int(os.getenv("dramatiq_dead_message_ttl",
                                            deadletters.DEFAULT_RETENTION_S * 1000))
#: How often ``join`` looks at the row count.
JOIN_POLL_S = 0.01
#: Exceptions of dead-lettered messages kept per queue for ``join(fail_fast=True)``.
FAILURES_KEPT = 100


#: A dead-lettered message's exception as kept for ``join``: its type and arguments.
Failure = tuple[type[BaseException], tuple[Any, ...]] | None


def _failure(exc: BaseException | None) -> Failure:
    return None if exc is None else (type(exc), exc.args)


def _rebuild(failure: Failure) -> BaseException:
    """The exception ``join(fail_fast=True)`` raises: same type and arguments."""
    if failure is None:
        return Exception("Message failed with unknown error")
    kind, args = failure
    try:
        return kind(*args)
    except Exception:
        return Exception(f"{kind.__name__}{args!r}")


def _wait_for_schema(database: Database, table: str, timeout_s: float) -> None:
    """The wait of a ``dramatiq`` worker process, which SIGTERM ends: the CLI's own handler only
    marks the process stopping, which its worker checks once booted, after this returns."""
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGTERM)

    def stopping(signum: int, frame: Any) -> None:
        stop.set()
        if callable(previous):
            previous(signum, frame)

    main = threading.current_thread() is threading.main_thread()
    if main:
        signal.signal(signal.SIGTERM, stopping)
    try:
        wait_for_schema(database, table, timeout_s=timeout_s, stop=stop)
    except SchemaMissing:
        if stop.is_set():  # told to stop before it started: nothing to undo
            raise SystemExit(0) from None
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


class DelayqBroker(Broker):
    """A Dramatiq broker whose messages, delayed ones included, are rows of the queue table.

    Parameters:
      url: the database (a libpq URL); ``DELAYQ_DATABASE_URL`` when neither it nor
        ``database`` is given.
      database: a ``Database`` to share instead of ``url`` (the broker does not close it).
      table: the queue table, shared with Celery's transport.
      middleware: Dramatiq's middleware list (Dramatiq's defaults when None).
      acquire_timeout: lease of a delivered message, in seconds; the worker extends it every
        third of it while it lives, and a killed worker's messages come back when it lapses.
      polling_interval: seconds between fallback polls when no notification arrives.
      dead_message_ttl: how long dead letters are kept, in ms (Dramatiq's unit and default,
        7 days, or the ``dramatiq_dead_message_ttl`` environment variable).
      max_priority: accept ``broker_priority`` 0..max_priority (at most 9); higher is served
        first, as on RabbitMQ. Each level is one more index scan per poll.
      durable_publish: True: a send returns once its row is flushed to disk. False: once
        committed, before the flush (what a crash can lose:
        docs/explanation/delivery.md#durability-of-a-publish). Acks and leases never wait for it.
      publish_linger: seconds (at most 1, 0 = off) a send may wait in this process' buffer; a
        thread writes what gathered as one multi-row insert per queue. On, ``send`` returns
        before its row is written: a process killed meanwhile loses up to that long of sends,
        and a write error is logged and retried, not raised. ``join``, ``flush``,
        ``flush_all``, ``close`` and interpreter exit write the buffer first; a forked child
        starts empty. Refused with ``durable_publish=True``.
      low_watermark: each poll starts above the rows this process already took, where only
        dead index entries lie; NOTIFYs and this process' own sends lower it, and a probe
        below the floor runs every 30 s in a thread of its own.
      fail_fast_default: ``join`` re-raises the exception of a message dead-lettered in this
        process (StubBroker's behaviour, for tests).
      namespace: prefix of the broker's row kinds (``<namespace>:<queue>``).
      ensure_schema: on start, read the migrations ledger and migrate only when a migration
        is missing; False skips the check.
      schema_wait: in a process the ``dramatiq`` command started, seconds to wait for
        delayq's tables before failing (docs/how-to/upgrade.md#a-worker-before-delayq-migrate);
        0 fails at once.
      pool_size: most connections of each of the process' two pools (opened on first use),
        plus one LISTEN connection per worker process.
      pooling: ``auto``, ``session`` or ``transaction``, as the Celery transport's option.
      listen_url: a direct URL for the LISTEN connection past a transaction pooler.
      unheard_polling_interval: seconds between polls when LISTEN cannot deliver (behind a
        transaction pooler without ``listen_url``).
      single_pool: one pool instead of two; relaxed statements set their settings per
        transaction (``SET LOCAL``), so a sending process holds one connection.
      freeze_gc: when the worker starts consuming, collect once and freeze what the process
        built while starting (``gc.freeze()``), so a full collection no longer walks it on the
        consumer's thread (the Celery transport's ``freeze_gc`` option, measured there).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        database: Database | None = None,
        table: str = "delayed_queue",
        middleware: list[Middleware] | None = None,
        acquire_timeout: float = DEFAULT_ACQUIRE_TIMEOUT_S,
        polling_interval: float = DEFAULT_POLLING_INTERVAL_S,
        dead_message_ttl: int = DEFAULT_DEAD_MESSAGE_TTL_MS,
        max_priority: int | None = None,
        durable_publish: bool = False,
        publish_linger: float = 0.0,
        low_watermark: bool = True,
        fail_fast_default: bool = False,
        namespace: str = names.NAMESPACE,
        ensure_schema: bool = True,
        schema_wait: float = DEFAULT_SCHEMA_WAIT_S,
        pool_size: int = 8,
        pooling: str = "auto",
        listen_url: str | None = None,
        unheard_polling_interval: float = 0.5,
        single_pool: bool = False,
        freeze_gc: bool = True,
    ) -> None:
        super().__init__(middleware=middleware)
        if max_priority is not None and not 0 <= max_priority < names.MAX_PRIORITY_LEVELS:
            raise ValueError(f"max_priority must be 0..{names.MAX_PRIORITY_LEVELS - 1}")
        self.queues: dict[str, None] = {}
        self.table = table
        self.namespace = namespace
        self.max_priority = max_priority or 0
        self.polling_interval = float(polling_interval)
        self.freeze_gc = bool(freeze_gc)
        #: The poll interval when LISTEN cannot deliver (behind a transaction pooler without
        #: ``listen_url``): the bound on how late a new message is found.
        self.unheard_polling_interval = float(unheard_polling_interval)
        self.lease_s = float(acquire_timeout)
        self.dead_message_ttl_s = dead_message_ttl / 1000
        self.durable_publish = durable_publish
        self.fail_fast_default = fail_fast_default
        self._owns_db = database is None
        if database is None:
            url = url or os.environ.get("DELAYQ_DATABASE_URL")
            if not url:
                raise InvalidInput("DelayqBroker needs url=, database= or DELAYQ_DATABASE_URL")
            # Opened on first use (min_size=0): a pool that opens one connection up front and is
            # used at once grows to two.
            database = Database(url, min_size=0, max_size=pool_size, single_pool=single_pool,
                                pooling=pooling, listen_url=listen_url)
        self.db = database
        # The start-up line Celery's banner gives (the URL libpq connects with, a failover
        # list already merged into it): which server a worker talks to, without its password.
        log.info("delayq: Dramatiq broker on %s (table %s)", mask_password(database.url), table)
        # A worker (``dramatiq.cli`` started this process) waits for the tables, where a
        # producer fails at once: it imports this broker before it can consume.
        wait = ensure_schema and "dramatiq.cli" in sys.modules
        if wait:
            try:
                _wait_for_schema(database, table, schema_wait)
            except BaseException:
                if self._owns_db:
                    database.close()
                raise
        self.queue = DelayedQueue(database, kind=f"{namespace}:", table=table,
                                  acquire_timeout=timedelta(seconds=acquire_timeout),
                                  ensure_schema=ensure_schema and not wait,
                                  relaxed_consumer_commits=True, low_watermark=low_watermark,
                                  naming=queues)
        self._kind_queues: dict[str, DelayedQueue] = {}
        self._failures: defaultdict[str, deque[Failure]] = defaultdict(
            lambda: deque(maxlen=FAILURES_KEPT))
        self._lock = threading.Lock()
        self._session: Session | None = None
        linger = check_linger(publish_linger, durable_publish=durable_publish)
        #: ``publish_linger`` on: this process' sends, written in batches (off: None).
        self.publisher = PublishBuffer(self.queue_for, linger) if linger else None

    @property
    def session(self) -> Session:
        """The consumer session of this broker's consumers (core/queue/session.py): its thread reads
        LISTEN, deletes acks in batches, extends leases and expires dead letters (every front
        end's: formats/deadletters.py)."""
        if self._session is None:
            self._session = Session(
                self.queue, listen=lambda: Listener(self.db, self.queue.queries),
                polling_interval=self.polling_interval,
                unheard_polling_interval=self.unheard_polling_interval,
                misfired=misfired_periodic(self), listen_on_thread=True,
                freeze_gc=self.freeze_gc,
                jobs=[deadletters.expiry_job(self.queue, self.dead_message_ttl_s)])
        return self._session

    def flush_publishes(self) -> None:
        """Write what this process buffered first: a purge or a join must see it."""
        if self.publisher is not None:
            self.publisher.flush()

    # -- names ------------------------------------------------------------------------

    def kinds_for(self, queue_name: str) -> list[str]:
        """Every kind of a queue, highest priority first (as the transport's ``kinds_for``)."""
        return names.kinds_for(queue_name, self.max_priority, self.namespace)

    def dead_letter_kind(self, queue_name: str) -> str:
        return names.dead_letter_kind(queue_name, self.namespace)

    def queue_for(self, kind: str) -> DelayedQueue:
        """The queue of one kind on the broker's pool, made once (as the transport's)."""
        q = self._kind_queues.get(kind)
        if q is None:
            q = self._kind_queues[kind] = self.queue.with_kind(kind)
        return q

    # -- the Broker API ------------------------------------------------------------------

    def declare_queue(self, queue_name: str) -> None:
        """Queues need no storage of their own: declaring only starts the worker's consumers."""
        queue_name = names.canonical(queue_name)
        if queue_name in self.queues:
            return
        for kind in (*self.kinds_for(queue_name), self.dead_letter_kind(queue_name)):
            if len(kind) > 100:
                raise InvalidInput(f"queue name too long for delayq: {queue_name!r}")
        self.emit_before("declare_queue", queue_name)
        self.queues[queue_name] = None
        self.emit_after("declare_queue", queue_name)
        delayed = dq_name(queue_name)
        self.delay_queues.add(delayed)
        self.emit_after("declare_delay_queue", delayed)

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """Store ``message``; with ``delay`` (ms, any size) its row becomes due at the eta."""
        queue_name = names.canonical(message.queue_name)
        eta: int | None = None
        if delay is not None:
            eta = current_millis() + int(delay)
            message = message.copy(queue_name=dq_name(queue_name), options={"eta": eta})
        elif message.queue_name.endswith(".DQ") and isinstance(message.options.get("eta"), int):
            eta = message.options["eta"]
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        priority = self._priority(message)
        self.emit_before("enqueue", message, delay)
        key = f"{message.message_id}.{os.urandom(6).hex()}"  # re-enqueues keep their id
        kind = names.kind_for(queue_name, priority, self.namespace)
        at = None if eta is None else from_ms(eta)
        if self.publisher is not None:
            self.publisher.put(kind, key, message.encode(), at, can_update=False)
        else:
            self.queue_for(kind).offer(key, message.encode(), at, can_update=False,
                                       durable=self.durable_publish)
        self.emit_after("enqueue", message, delay)
        return message

    def _priority(self, message: Message) -> int:
        value = message.options.get("broker_priority")
        if value is None or not self.max_priority:
            return 0
        if not isinstance(value, int) or not 0 <= value <= self.max_priority:
            raise ValueError(f"broker_priority must be an int 0..{self.max_priority}: {value!r}")
        return value

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> Consumer:
        if names.canonical(queue_name) not in self.queues:
            raise QueueNotFound(queue_name)
        if queue_name.endswith(".DQ"):
            return IdleConsumer(timeout)
        return DelayqConsumer(self, queue_name, prefetch, timeout)

    def flush(self, queue_name: str) -> None:
        """Drop the waiting messages of a queue, due and delayed (``q`` and ``q.DQ`` alike:
        a delayed message is a row of its queue); messages being processed stay."""
        self.flush_publishes()
        self.queue.purge(self.kinds_for(queue_name))

    def flush_all(self) -> None:
        """Drop the waiting messages and the dead letters of every declared queue."""
        self.flush_publishes()
        kinds = [k for q in self.queues for k in (*self.kinds_for(q), self.dead_letter_kind(q))]
        if kinds:
            self.queue.purge(kinds)
        self._failures.clear()

    def join(self, queue_name: str, *, timeout: int | None = None,
             fail_fast: bool | None = None) -> None:
        """Wait until the queue has no row left: due, delayed or being processed."""
        queue_name = names.canonical(queue_name)
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        if self.publisher is not None and not self.publisher.flush(
                None if timeout is None else timeout / 1000):
            raise QueueJoinTimeout(queue_name)
        kinds = self.kinds_for(queue_name)
        while count_all(self.queue, kinds):
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            if self._session is not None:
                self._session.flush()
            time.sleep(JOIN_POLL_S)
        if fail_fast if fail_fast is not None else self.fail_fast_default:
            for failure in list(self._failures[queue_name]):
                raise _rebuild(failure) from None

    def close(self) -> None:
        """Release what any consumer of this broker still holds, stop the session."""
        if self.publisher is not None:
            self.publisher.close()
        session, self._session = self._session, None
        if session is not None:
            for sub in session.subscriptions():
                session.unsubscribe(sub)
            session.close()
        self.queue.close()  # sends the wake-ups still pending (core/queue/announce.py)
        if self._owns_db:
            self.db.close()

    # -- dead letters -------------------------------------------------------------------

    def record_failure(self, queue_name: str, message: MessageProxy,
                       exc: BaseException | None) -> None:
        """Remember a dead-lettered message's exception for ``join(fail_fast=True)``.

        Only its type and arguments are kept (the exception is rebuilt when raised): holding
        the exception would keep its traceback's frames alive for the broker's lifetime.
        """
        self._failures[names.canonical(queue_name)].append(_failure(exc))

    def dead_letters_of(self, queue_name: str, limit: int = 100) -> list[Message]:
        """Dead-lettered messages of a queue, newest first, as they were when they failed
        (without the failure options the nack adds for the dead-letter page)."""
        rows = list_kinds(self.queue, [self.dead_letter_kind(queue_name)], limit)
        messages = [Message.decode(r.payload) for r in rows]
        return [m._replace(options={k: v for k, v in m.options.items()
                                    if k not in names.FAILURE_OPTIONS}) for m in messages]

    @property
    def dead_letters(self) -> list[Message]:
        """Dead letters of every declared queue (StubBroker's attribute, read from the table)."""
        return [m for q in sorted(self.queues) for m in self.dead_letters_of(q)]

    def expire_dead_letters(self) -> int:
        """Delete dead letters whose retention ended, every front end's (the session does it
        every minute: formats/deadletters.py)."""
        return deadletters.expire_all(self.queue)

    def stats(self, queue_name: str) -> dict[str, Any]:
        """Rows of a queue (due, delayed and in flight together) and its dead letters."""
        return {"messages": count_all(self.queue, self.kinds_for(queue_name)),
                "dead_letters": count_all(self.queue,
                                                     [self.dead_letter_kind(queue_name)])}
