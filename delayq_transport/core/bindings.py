"""Exchange bindings shared by every process, and the broadcasts they route.

kombu's virtual transports keep bindings in process memory, so a producer only routes to
queues it declared itself. The kombu transport keeps them in ``<table>__bindings`` instead;
this module is that table's whole API (its statements live in ``queries.sql``).
"""

from __future__ import annotations

from .db import Database
from .queries import Queries

#: Seconds a binding's heartbeat stays live: consumers touch theirs every quarter of it, and
#: listings (the web page's workers) count a queue as consumed while its heartbeat is younger.
DEFAULT_BINDING_TTL_S = 60.0


class Bindings:
    """Bindings of one queue table. Times are the database clock's epoch milliseconds."""

    def __init__(self, db: Database, queries: Queries) -> None:
        self.db = db
        self.q = queries

    def bind(self, exchange: str, routing_key: str, queue: str, pattern: str,
             exchange_type: str, auto_delete: bool) -> None:
        """Record (or refresh) one binding so every process routes the same way."""
        self.db.execute(self.q["bindings_upsert"], {
            "exchange": exchange, "routing_key": routing_key, "queue": queue,
            "pattern": pattern, "exchange_type": exchange_type, "auto_delete": auto_delete,
            "now": None,
        })

    def routes(self, exchange: str, live_ms: int) -> list[tuple[str, str, str]]:
        """(routing key, pattern, queue) of ``exchange``; auto-delete queues count only while
        their consumer was seen within ``live_ms``."""
        rows = self.db.fetchall(self.q["bindings_for_exchange"],
                                {"exchange": exchange, "live_ms": live_ms, "now": None})
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
