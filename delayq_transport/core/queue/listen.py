"""The LISTEN side of wake-ups: one dedicated connection per consumer process.

The insert and release triggers (migration 2) send ``NOTIFY delayq_<table>, '<kind>:<ms>'``.
A consumer keeps one connection that LISTENs and reads notifications without blocking; its
file descriptor goes into the consumer's event loop. Driver errors become
:class:`~..db.errors.DatabaseUnavailable` here, so adapters never handle psycopg's exceptions.
"""

from __future__ import annotations

import logging
import random
import select
import time
from typing import Any

import psycopg
from psycopg.pq import ConnStatus

from ..db.database import Database
from ..db.errors import DatabaseUnavailable, ListenUndeliverable
from ..db.queries import Queries
from .announce import MARKER_PREFIX

log = logging.getLogger(__name__)

#: The kind of a probe's notification: drain() drops them, so consumers never take a probe (of
#: this process or another's) for a wake-up.
PROBE_KIND = "delayq probe"
#: How long a new LISTEN connection waits for its probe: one arrives within a millisecond or
#: two on a working connection, never behind a transaction pooler.
PROBE_TIMEOUT_S = 2.0


class Listener:
    """A LISTENing connection: ``fileno()`` for select/epoll, ``drain()`` for what arrived."""

    def __init__(self, db: Database, queries: Queries, *,
                 probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        """LISTEN, then prove that notifications arrive: one is sent from a pooled connection
        and must reach this one within ``probe_timeout_s``. Raises
        :class:`~..db.errors.ListenUndeliverable` when they cannot: behind a transaction pooler
        (detected, and no direct ``listen_url``: LISTEN is not even tried, since the server
        session it would leave listening is lent to other clients, whose drivers then keep
        every wake-up), or when the probe does not come back."""
        if db.transaction_pooling and db.listen_url == db.url:
            raise ListenUndeliverable(
                "LISTEN cannot deliver through a transaction pooler: polling instead "
                "(give a direct listen_url for push wake-ups)", expected=True)
        self._conn: psycopg.Connection[Any] = db.connect(listen=True)
        try:
            self._conn.execute(queries["listen"])
        except psycopg.Error as exc:
            self._conn.close()
            raise DatabaseUnavailable(f"LISTEN failed: {exc}") from exc
        #: Kept apart: psycopg's fileno() raises once the connection broke, and an event loop
        #: still needs the number to unregister it.
        self.fd: int = self._conn.fileno()
        #: What arrived with LISTEN's own reply: psycopg kept it, and drain() reads libpq.
        self._early = [p for n in self._conn.notifies(timeout=0) for p in _parse(n.payload)]
        self._probe(db, queries, probe_timeout_s)

    def _probe(self, db: Database, queries: Queries, timeout_s: float) -> None:
        token = random.getrandbits(62)
        db.execute(queries["listen_probe"], {"payload": f"{PROBE_KIND}:{token}"})
        deadline = time.monotonic() + timeout_s
        while True:
            notes = self._read()
            # Wake-ups that came meanwhile are kept for the first drain, as LISTEN's own are.
            self._early.extend(note for note in notes if note[0] != PROBE_KIND)
            if (PROBE_KIND, token) in notes:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.wait(remaining)
        try:
            self._conn.execute(queries["unlisten"])
        except psycopg.Error:
            pass  # closing below ends the LISTEN of a real session anyway
        self._conn.close()
        raise ListenUndeliverable(
            f"LISTEN on {db.listen_url.split('@')[-1]} did not deliver a notification within "
            f"{timeout_s:.0f} s (a transaction pooler?): polling instead")

    @property
    def closed(self) -> bool:
        return bool(self._conn.closed)

    def drain(self) -> list[tuple[str, int]]:
        """(kind, scheduledAt ms) of every notification received so far, without waiting.

        Raises DatabaseUnavailable when the connection broke (the caller reconnects and polls
        for whatever it missed meanwhile).
        """
        # libpq directly (read what the socket holds, then take the parsed notifications):
        # psycopg's ``notifies(timeout=0)`` waits on the socket through a generator and a
        # selector, ~15 us more per call, and a busy worker drains about once per task.
        out = self._read()
        if out and any(kind == PROBE_KIND for kind, _ in out):  # another consumer's probe
            out = [note for note in out if note[0] != PROBE_KIND]
        return out

    def _read(self) -> list[tuple[str, int]]:
        pgconn = self._conn.pgconn
        try:
            pgconn.consume_input()
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"LISTEN connection lost: {exc}") from exc
        if pgconn.status != ConnStatus.OK:
            raise DatabaseUnavailable("LISTEN connection lost: the server closed it")
        out, self._early = self._early, []
        while (note := pgconn.notifies()) is not None:
            out.extend(_parse(note.extra.decode()))
        return out

    def wait(self, timeout: float) -> None:
        """Block until a notification may have arrived or ``timeout`` seconds passed."""
        try:
            select.select([self.fd], [], [], timeout)
        except (OSError, ValueError) as exc:
            raise DatabaseUnavailable(f"LISTEN connection lost: {exc}") from exc

    def close(self) -> None:
        self._conn.close()


def _parse(payload: str) -> list[tuple[str, int]]:
    """``kind:ms`` (the kind may itself contain ``:``): a row of ``kind`` due at ``ms``.

    A search marker ``\\x1ekind:ms`` (core/queue/announce.py) comes out as two notes: the marker
    itself, its kind still prefixed (no consumer consumes such a kind; the low watermark reads
    it, ``DelayedQueue.lower_watermark``), and its time as a plain due time of ``kind``, to
    wake at. A payload of neither form (a newer version's) is skipped: a wake-up lost only
    delays its rows to the next search or fallback poll, a consumer that crashed on it stops."""
    kind, _, at = payload.rpartition(":")
    try:
        ms = int(at)
    except ValueError:
        log.warning("delayq: notification %r is not 'kind:ms': ignored", payload[:80])
        return []
    if kind.startswith(MARKER_PREFIX):
        return [(kind, ms), (kind[len(MARKER_PREFIX):], ms)]
    return [(kind, ms)]
