"""The LISTEN side of wake-ups: one dedicated connection per consumer process.

The insert and release triggers (migration 2) send ``NOTIFY delayq_<table>, '<kind>:<ms>'``.
A consumer keeps one connection that LISTENs and reads notifications without blocking; its
file descriptor goes into the consumer's event loop. Driver errors become
:class:`~.errors.DatabaseUnavailable` here, so adapters never handle psycopg's exceptions.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from psycopg.pq import ConnStatus

from .db import Database
from .errors import DatabaseUnavailable
from .queries import Queries


class Listener:
    """A LISTENing connection: ``fileno()`` for select/epoll, ``drain()`` for what arrived."""

    def __init__(self, db: Database, queries: Queries) -> None:
        self._conn: psycopg.Connection[Any] = db.connect()
        try:
            self._conn.execute(queries["listen"])
        except psycopg.Error as exc:
            self._conn.close()
            raise DatabaseUnavailable(f"LISTEN failed: {exc}") from exc
        #: Kept apart: psycopg's fileno() raises once the connection broke, and an event loop
        #: still needs the number to unregister it.
        self.fd: int = self._conn.fileno()
        #: What arrived with LISTEN's own reply: psycopg kept it, and drain() reads libpq.
        self._early = [_parse(n.payload) for n in self._conn.notifies(timeout=0)]

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
        pgconn = self._conn.pgconn
        try:
            pgconn.consume_input()
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"LISTEN connection lost: {exc}") from exc
        if pgconn.status != ConnStatus.OK:
            raise DatabaseUnavailable("LISTEN connection lost: the server closed it")
        out, self._early = self._early, []
        while (note := pgconn.notifies()) is not None:
            out.append(_parse(note.extra.decode()))
        return out

    def wait(self, timeout: float) -> None:
        """Block until a notification may have arrived or ``timeout`` seconds passed."""
        try:
            select.select([self.fd], [], [], timeout)
        except (OSError, ValueError) as exc:
            raise DatabaseUnavailable(f"LISTEN connection lost: {exc}") from exc

    def close(self) -> None:
        self._conn.close()


def _parse(payload: str) -> tuple[str, int]:
    """``kind:ms`` (the kind may itself contain ``:``)."""
    kind, _, at = payload.rpartition(":")
    return kind, int(at)
