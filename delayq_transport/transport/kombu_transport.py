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
    delayq+postgresql://USER@HOST1:PORT,HOST2:PORT/DBNAME?target_session_attrs=read-write
    delayq+postgresql://USER@HOST1/DBNAME;delayq+postgresql://USER@HOST2/DBNAME

The second is libpq's multi-host form; the third kombu's failover list (each alternate is
parsed by kombu, so it cannot carry query parameters). See docs/how-to/standby.md.

``import delayq_transport`` (in the module that creates the Celery app) registers the scheme
with kombu; that is the one extra step next to changing ``broker_url``.

Transport Options
=================
Set through Celery's ``broker_transport_options``. Each option, its default, unit and meaning
is declared once in :data:`.options.TRANSPORT_OPTIONS`, which the transport reads and
docs/reference/transport-options.md is rendered from.
"""

from __future__ import annotations

import logging
import socket
import time
from concurrent.futures import Future
from typing import Any

import psycopg
from kombu.transport import TRANSPORT_ALIASES, virtual

from ..core.errors import DatabaseError, DatabaseUnavailable, InvalidInput
from ..core.publish_buffer import check_linger
from .backend import Backend
from .channel import DelayqChannel
from .maintenance import Maintenance
from .options import (
    BACKEND_OPTIONS,
    DEFAULT_ACK_FLUSH_INTERVAL_S,
    DEFAULT_CLOSE_WAIT_S,
    DEFAULT_POLLING_INTERVAL_S,
    SKEW_RETRY_S,
)
from .poller import Poller, PollPlan, fetch_all
from .ports import ChannelPort
from .urls import render, url_from_client
from .wakeups import Wakeups

log = logging.getLogger(__name__)

for _scheme in ("delayq", "delayq+postgresql", "delayq+postgres"):  # see delayq_transport
    TRANSPORT_ALIASES.setdefault(_scheme, "delayq_transport.transport:Transport")


class Transport(virtual.Transport):
    """kombu transport whose broker is a PostgreSQL table.

    The transport owns what its channels share: the :class:`~.backend.Backend` (pool, queue,
    bindings), the LISTEN connection (:class:`~.wakeups.Wakeups`), the poller thread
    (:class:`~.poller.Poller`) and the maintenance thread (:class:`~.maintenance.Maintenance`).
    It decides *when* to poll (woken, due, fallback); channels decide *what* to poll.
    """

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
    #: What kombu's ``Connection.ensure`` retries after reconnecting and re-raises as its own
    #: ``OperationalError``: the database unreachable, nothing else. Without these two kombu
    #: counts every channel error as recoverable, so a ``DatabaseError`` (a refusal that
    #: retrying cannot fix: ``TransactionRefused``, ``PermissionDenied``, ``SchemaMissing``)
    #: cost a reconnect and a second try and reached ``apply_async``'s caller wrapped in
    #: ``OperationalError``, where ``except delayq_transport.TransactionRefused`` missed it.
    #: Declared, a refusal reaches the caller as raised, on the first try.
    recoverable_connection_errors = connection_errors
    recoverable_channel_errors: tuple[type[BaseException], ...] = ()

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
        self._backend_opts = {k: options[k] for k in BACKEND_OPTIONS if k in options}
        if options.get("unlogged_table") and options.get("durable_publish"):
            raise InvalidInput("durable_publish=True asks for publishes that survive a crash; "
                               "unlogged_table=True empties the table in one: choose one")
        check_linger(options.get("publish_linger", 0),
                     durable_publish=bool(options.get("durable_publish")))
        if getattr(client, "connect_timeout", None):
            # A dead host of a failover list must not cost more than kombu's own timeout.
            self._backend_opts.setdefault("connect_timeout", float(client.connect_timeout))
        self._backend: Backend | None = None
        self.wakeups = Wakeups(self)
        self.maintenance = Maintenance(self)
        self._poller = Poller(self._kick_loop)
        self._hub: Any = None
        self._hub_timer: Any = None
        self._kick: tuple[socket.socket, socket.socket] | None = None
        self._next_fallback = 0.0
        self._inflight: tuple[Future[Exception | None], list[PollPlan]] | None = None
        #: True on the instance only: ``Connection.as_uri`` then asks :meth:`as_uri`, while
        #: ``Connection.__init__``, which reads the class, still takes ``delayq://`` URLs apart
        #: into host and port as kombu's failover expects.
        self.can_parse_url = True
        super().__init__(client, **kwargs)

    @staticmethod
    def _url_from_client(client: Any) -> str:
        """The libpq URL of the connection kombu is making (see :mod:`.urls`)."""
        return url_from_client(client)

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        """The broker URL for banners and logs, password masked: kombu's own rendering fails
        on a libpq multi-host URL (see :mod:`.urls`)."""
        return render(self.client, include_password, mask)

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

    # The parts' view of the transport (ports.TransportPort): what channels, wake-ups and
    # maintenance may call.

    @property
    def hub(self) -> Any:
        """Celery's event loop, once the worker registered it (None without one)."""
        return self._hub

    def all_channels(self) -> list[DelayqChannel]:
        return list(self.channels)

    def consuming(self) -> list[DelayqChannel]:
        return [c for c in self.channels if c.consumed_queues() and not c.closed]

    def sleep(self, timeout: float) -> None:
        """Wait ``timeout`` seconds, or less if the transport is closing."""
        self.maintenance.sleep(timeout)

    def consuming_started(self, channel: ChannelPort) -> None:
        from . import control  # a consumer (a worker): `celery inspect scheduled` reads the table

        control.register()
        channel.poll_wanted = True
        self.wakeups.ensure()
        self.maintenance.ensure()
        self.maintenance.touch_bindings()

    def ensure_maintenance(self) -> None:
        """``basic_get`` needs the ack flush and lease extension too."""
        self.maintenance.ensure()

    def channel_closed(self, channel: ChannelPort) -> None:
        if not self.consuming():
            self.wakeups.close()

    def wake(self, channel: ChannelPort | None = None) -> None:
        """Poll ``channel`` (default: every channel) at the next chance."""
        for c in self.channels if channel is None else (channel,):
            c.poll_wanted = True

    # -- polling (shared by the event loop and drain_events) ------------------------------

    def _plans(self) -> list[PollPlan] | None:
        """What each channel that wants a poll has room for; None if none has. A channel with
        a full prefetch window stays wanted: it is polled as soon as an ack frees room."""
        plans = []
        for channel in self.consuming():
            if channel.poll_wanted and (plan := channel.plan_poll()) is not None:
                channel.poll_wanted = False
                plans.append(plan)
        return plans or None

    def _deliver_polled(self, plans: list[PollPlan], error: Exception | None) -> int:
        """Deliver fetched messages and learn when to look again. When the queues are drained,
        the next due time arms a timer instead of a poll loop; a due time already past
        (host/database clock skew) is retried shortly."""
        delivered = 0
        floor = int((time.time() + SKEW_RETRY_S) * 1000)
        for plan in plans:
            channel = plan.channel
            delivered += channel.deliver(plan)
            channel.backlog = plan.more
            if plan.more or error is not None:
                channel.poll_wanted = True
            else:
                channel.next_due_ms = None if plan.next_due is None else max(plan.next_due, floor)
        if self._hub is not None:  # a backlogged channel polls anyway: no read per wake-up
            self.wakeups.deafen(error is None and any(c.backlog for c in self.consuming()))
        if error is not None:
            raise error
        return delivered

    def _poll_once(self) -> int | None:
        """One synchronous pass (``drain_events``); None if no channel had room."""
        plans = self._plans()
        if plans is None:
            return None
        return self._deliver_polled(plans, fetch_all(plans))

    # -- polling off the event loop (see poller.py) ----------------------------------------

    def _start_poll(self) -> None:
        plans = self._plans()
        if plans is not None:
            self._inflight = (self._poller.submit(plans), plans)

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
        self.schedule_hub_timer()

    def _abandon_poll(self) -> None:
        """Closing: give back what an unfinished poll takes, so it is not held for a lease."""
        inflight, self._inflight = self._inflight, None
        self._poller.stop()
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
        dues = [c.next_due_ms for c in self.consuming() if c.next_due_ms is not None]
        return min(dues) / 1000 - time.time() if dues else None

    def _should_poll(self) -> bool:
        """Whether some channel wants a poll: woken, due, or the fallback interval is up."""
        if self._inflight is not None:
            return False
        now = time.monotonic()
        if now >= self._next_fallback:
            self._next_fallback = now + self.polling_interval
            self.wake()
        now_ms = time.time() * 1000
        wanted = False
        for channel in self.consuming():
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
            self.wakeups.drain()
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
            self.wakeups.wait(max(min(waits), 0.0))

    # -- kombu event loop (Celery's async worker loop) -------------------------------------

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        self._hub = loop
        if self._kick is None:
            self._kick = socket.socketpair()
            for sock in self._kick:
                sock.setblocking(False)
        loop.add_reader(self._kick[0].fileno(), self._on_kick)
        loop.on_tick.add(self._on_tick)
        loop.call_repeatedly(self.polling_interval, self.wake)
        self.wakeups.attach(loop)

    def _on_kick(self) -> None:
        try:
            self._kick[0].recv(4096)  # type: ignore[index]
        except BlockingIOError:
            pass
        self._finish_poll()

    def _on_tick(self) -> None:
        # The loop ticks ~2 times per task under load: _should_poll answers a poll in flight
        # first, before it looks at any channel (and finds none wanting when none consumes).
        if not self._should_poll():
            return
        if self.wakeups.listener is None and not self.wakeups.unheard:
            self.wakeups.reset()  # LISTEN was lost and could not be re-established yet
        self._start_poll()

    def schedule_hub_timer(self) -> None:
        """Wake the loop exactly when the earliest known message becomes due."""
        hub, wait = self._hub, self._seconds_until_due()
        if hub is None or wait is None:
            return
        if self._hub_timer is not None:
            self._hub_timer.cancel()
        # Nothing to do when it fires: the loop comes round and _should_poll sees who is due.
        self._hub_timer = hub.call_later(max(wait, SKEW_RETRY_S), lambda: None)

    # -- lifecycle -------------------------------------------------------------------------

    def close_connection(self, connection: Any) -> None:
        try:
            self._abandon_poll()
            super().close_connection(connection)
        finally:
            self.maintenance.stop()
            self.wakeups.close()
            if self._kick is not None:
                if self._hub is not None:
                    self._hub.remove(self._kick[0].fileno())
                for sock in self._kick:
                    sock.close()
                self._kick = None
            backend, self._backend = self._backend, None
            if backend is not None:
                backend.release()
