"""A dedicated LISTEN connection for one queue table's wake-up notifications.

Inserts (and rows made available again) notify ``kind:scheduledAt-ms`` (see the
``notify_function`` block of ``queries.sql``). Consumers block on :meth:`Listener.wait` instead of
polling: a due message wakes them at once, a future one tells them when to look. A broken
connection (server restart) is reopened on the next call, and the caller is told to poll once,
because notifications sent meanwhile are lost.
"""

from __future__ import annotations

import logging
import select
import threading
from typing import Any, NamedTuple

import psycopg

from .db import Database
from .errors import DatabaseUnavailable
from .queries import Queries

log = logging.getLogger(__name__)


class Notice(NamedTuple):
    """One wake-up: a row of ``kind`` became available at ``at_ms`` (epoch ms)."""

    kind: str
    at_ms: int


#: Returned by ``wait`` after a reconnect: notifications may have been lost, poll everything.
RECONNECTED = Notice("", 0)


class Listener:
    """Owns one connection outside the pool; ``wait`` is meant for a single thread."""

    def __init__(self, db: Database, table: str = "delayed_queue") -> None:
        self.db = db
        self.queries = Queries(table)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self.db.connect()
        conn.execute(self.queries["listen"])
        return conn

    def wait(self, timeout_s: float) -> list[Notice]:
        """Block up to ``timeout_s`` for notifications; ``[RECONNECTED]`` after a reconnect."""
        with self._lock:
            conn, fresh = self._conn, False
            if conn is None or conn.closed:
                try:
                    conn = self._conn = self._connect()
                    fresh = True
                except DatabaseUnavailable as exc:
                    log.warning("delayq: LISTEN connection unavailable, polling: %s", exc)
                    return [RECONNECTED]
        try:
            if not fresh:
                select.select([conn.fileno()], [], [], max(timeout_s, 0.0))
            notes = list(conn.notifies(timeout=0))
        except (psycopg.Error, OSError, ValueError) as exc:
            log.warning("delayq: LISTEN connection lost, reconnecting: %s", exc)
            self.close()
            return [RECONNECTED]
        found = [RECONNECTED] if fresh else []
        for note in notes:
            kind, _, at = note.payload.rpartition(":")
            try:
                found.append(Notice(kind, int(at)))
            except ValueError:
                continue
        return found

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
