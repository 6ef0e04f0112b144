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

import socket
from typing import Any

import psycopg
from kombu.transport import TRANSPORT_ALIASES, virtual

from ..core import DatabaseError, DatabaseUnavailable, InvalidInput
from ..core.queue import Session, check_linger
from ..formats import deadletters
from .backend import IN_WORKER, WORKER_STOPPING, Backend
from .channel import DelayqChannel, misfired_beats
from .options import (
    BACKEND_OPTIONS,
    DEFAULT_ACK_FLUSH_INTERVAL_S,
    DEFAULT_BINDING_TTL_S,
    DEFAULT_POLLING_INTERVAL_S,
    TRANSPORT_OPTIONS,
)
from .urls import render, url_from_client

for _scheme in ("delayq", "delayq+postgresql", "delayq+postgres"):  # see delayq_transport
    TRANSPORT_ALIASES.setdefault(_scheme, "delayq_transport.transport:Transport")


def _worker_starts(**_: Any) -> None:
    """Celery's ``worker_init``, sent before the worker connects (kombu imported this module
    when the app made its first connection object): its backend waits for the tables."""
    IN_WORKER.set()


def _worker_stops(**_: Any) -> None:
    """Celery's ``worker_shutting_down`` (SIGTERM, SIGINT): a wait for the tables ends."""
    WORKER_STOPPING.set()


try:
    from celery import signals as _celery_signals
except ImportError:  # kombu without Celery: no worker to wait in
    pass
else:
    _celery_signals.worker_init.connect(_worker_starts, weak=False)
    _celery_signals.worker_shutting_down.connect(_worker_stops, weak=False)


class Transport(virtual.Transport):
    """kombu transport whose broker is a PostgreSQL table.

    The transport owns what its channels share: the :class:`~.backend.Backend` (pool, queue,
    bindings) and the consumer :class:`~delayq_transport.core.queue.Session` (LISTEN, the
    due-time timers, pacing, polls off the event loop, batched acks, leases), of which each
    consuming channel is one subscription.
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
        self._session: Session | None = None
        self._hub: Any = None
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
    def session(self) -> Session:
        """The consumer session, made on the first consume or get."""
        if self._session is None:
            backend, ttl = self.backend, DEFAULT_BINDING_TTL_S
            self._session = Session(
                backend.queue, listen=backend.listener, polling_interval=self.polling_interval,
                unheard_polling_interval=TRANSPORT_OPTIONS.read(self.options,
                                                                "unheard_polling_interval"),
                batch_size=TRANSPORT_OPTIONS.read(self.options, "batch_size"),
                ack_flush_interval=self.ack_flush_interval,
                misfired=misfired_beats(backend.queue),
                freeze_gc=TRANSPORT_OPTIONS.read(self.options, "freeze_gc"),
                jobs=[(ttl / 4, self.touch_bindings),
                      (ttl, lambda: backend.bindings.drop_stale_transient(int(ttl * 10_000))),
                      deadletters.expiry_job(backend.queue, TRANSPORT_OPTIONS.read(
                          self.options, "dead_letter_retention"))])
            if self._hub is not None:
                self._session.attach(self._hub)
        return self._session

    def establish_connection(self) -> Any:
        self.backend  # noqa: B018 - connect now, so errors surface as connection errors
        return super().establish_connection()

    def driver_version(self) -> str:
        return psycopg.__version__

    def consuming_started(self) -> None:
        """A channel consumes: listen, tell the other processes its queues are live, and answer
        `celery inspect scheduled` from the table (a consumer is a worker)."""
        from . import control

        control.register()
        self.session.listening()
        self.touch_bindings()

    def touch_bindings(self) -> None:
        queues = sorted({q for c in self.channels if not c.closed for q in c._active_queues})
        self.backend.bindings.touch(queues)

    def drain_events(  # type: ignore[override]
        self, connection: Any, timeout: float | None = None
    ) -> None:
        """Blocking consume without an event loop: wait on NOTIFY, the due timer or fallback."""
        self.session.serve(timeout)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Celery's worker loop: the session registers its sockets and timers. A warm shutdown
        (SIGTERM) then wakes the loop at once instead of after the fallback poll's timer."""
        self._hub = loop
        self.session.attach(loop)
        try:
            from celery import signals
        except ImportError:  # kombu without Celery: nothing sends it
            return
        signals.worker_shutting_down.connect(self._shutting_down, weak=False)

    def _shutting_down(self, **_: Any) -> None:
        """Celery's signal handler: one send on the session's socket, the loop wakes and sees
        the shutdown flag."""
        if self._session is not None:
            self._session.kick()

    def close_connection(self, connection: Any) -> None:
        try:
            super().close_connection(connection)  # each channel settles what it holds
        finally:
            session, self._session = self._session, None
            if session is not None:
                session.close()
            if self._hub is not None:
                try:
                    from celery import signals
                except ImportError:
                    pass
                else:
                    signals.worker_shutting_down.disconnect(self._shutting_down)
            backend, self._backend = self._backend, None
            if backend is not None:
                backend.release()
