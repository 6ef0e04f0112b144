"""Exchange bindings shared by every process, and the broadcasts they route.

kombu's virtual transports keep bindings in process memory, so a producer only routes to
queues it declared itself. The kombu transport keeps them in ``<table>__bindings`` instead;
this module is that table's whole API (its statements live in ``bindings.sql``).

Inside a caller's transaction (core/queue/joined.py) routing reads the bindings through the caller's
connection, and a binding kombu declares there (Celery declares a task's queue on its first
publish per connection) is kept in memory and written by the next binding or routing lookup
made outside one: written in the caller's transaction, the upsert's row lock would hold every
other producer's declaration of that queue until the commit, and a rollback would drop a
binding kombu remembers as declared; written through delayq's pool, it would use a connection
of delayq's own in the middle of the caller's transaction. The declaring process routes with
kombu's in-memory copy meanwhile, and consumers bind their queues themselves.
"""

from __future__ import annotations

from typing import Any

from ..db.database import Database
from ..db.queries import Queries
from ..queue.joined import current

#: Seconds a binding's heartbeat stays live: consumers touch theirs every quarter of it, and
#: listings (the web page's workers) count a queue as consumed while its heartbeat is younger.
DEFAULT_BINDING_TTL_S = 60.0


class Bindings:
    """Bindings of one queue table. Times are the database clock's epoch milliseconds."""

    def __init__(self, db: Database, queries: Queries) -> None:
        self.db = db
        self.q = queries
        #: Bindings declared inside a caller's transaction, not written yet (see the module).
        self._deferred: list[dict[str, Any]] = []

    def bind(self, exchange: str, routing_key: str, queue: str, pattern: str,
             exchange_type: str, auto_delete: bool) -> None:
        """Record (or refresh) one binding so every process routes the same way."""
        params = {"exchange": exchange, "routing_key": routing_key, "queue": queue,
                  "pattern": pattern, "exchange_type": exchange_type,
                  "auto_delete": auto_delete, "now": None}
        if current() is not None:
            self._deferred.append(params)
            return
        self._write_deferred()
        self.db.execute(self.q["bindings_upsert"], params)

    def _write_deferred(self) -> None:
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for params in deferred:
                self.db.execute(self.q["bindings_upsert"], params)

    def routes(self, exchange: str, live_ms: int) -> list[tuple[str, str, str]]:
        """(routing key, pattern, queue) of ``exchange``; auto-delete queues count only while
        their consumer was seen within ``live_ms``."""
        params = {"exchange": exchange, "live_ms": live_ms, "now": None}
        if (joined := current()) is not None:
            joined.check_database(self.db)
            rows = joined.run(self.q.portable("bindings_for_exchange"), params)
        else:
            self._write_deferred()
            rows = self.db.fetchall(self.q["bindings_for_exchange"], params)
        return [(r[0], r[1], r[2]) for r in rows]

    def has_queue(self, queue: str) -> bool:
        return bool(self.db.fetchall(self.q["bindings_has_queue"], {"queue": queue}))

    def forget_queue(self, queue: str) -> None:
        self.db.execute(self.q["bindings_delete_queue"], {"queue": queue})

    def touch(self, queues: list[str]) -> None:
        """Consumers mark their queues alive; broadcasts only reach queues seen recently."""
        if queues:
            self.db.execute(self.q["bindings_touch"], {"queues": queues, "now": None})

    def broadcast(self, exchange: str, key: str, payload: bytes, live_ms: int) -> None:
        """One copy of ``payload`` per queue bound to ``exchange`` and seen within ``live_ms``."""
        self.db.execute(self.q["fanout_insert"], {
            "key": key, "payload": payload, "exchange": exchange, "live_ms": live_ms,
            "now": None,
        })

    def drop_stale_transient(self, stale_ms: int) -> None:
        """Forget auto-delete queues unseen for ``stale_ms`` and their waiting rows."""
        self.db.execute(self.q["janitor_transient_queues"], {"stale_ms": stale_ms, "now": None})
