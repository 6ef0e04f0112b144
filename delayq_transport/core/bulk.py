"""Bulk offers at the speed of COPY: binary COPY into a staging table, one merge per flush.

``DelayedQueue.offer_batch`` sends rows as arrays in one ``INSERT ... SELECT unnest(...)``;
for millions of rows (the Spark pipeline) the client cost of building those arrays dominates.
A :class:`BulkWriter` instead takes rows already in PostgreSQL's binary COPY tuple format
(built by the caller, e.g. in Spark's JVM, or by :func:`copy_record`), streams them into a
per-connection TEMP table, and merges every ``flush_rows`` rows into the queue table with one
``INSERT ... SELECT ... ON CONFLICT`` (``bulk_merge_ignore`` / ``bulk_merge_update``).

Guarantees: outcomes are counted exactly per merge (created = rows inserted; with updates,
``RETURNING`` tells created from updated; every other staged row was ignored). Each merge is
one autocommit statement, so a writer that dies mid-way leaves whole merges behind and a
re-run finds their keys (idempotent by ``(key, kind)``). Client memory is one caller chunk;
the staged rows live in PostgreSQL until their merge.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from .db import Database, translate
from .errors import DatabaseError, InvalidInput
from .queries import Queries

#: Header and trailer of PostgreSQL's binary COPY format (signature, flags, extension length).
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
COPY_TRAILER = b"\xff\xff"
#: Rows staged before one merge: large enough that per-statement costs vanish, small enough
#: that a flush fits the session's temp_buffers (bulk_session_setup) for ~1 KB messages.
FLUSH_ROWS = 50_000
#: A merge that deadlocks with another writer's is retried (staged rows are still there).
MERGE_ATTEMPTS = 5
_STAGE_FIELDS = struct.Struct(">hi")
_INT8_FIELD = struct.Struct(">iq")


def copy_record(key: str, kind: str, payload: bytes, at_ms: int) -> bytes:
    """One (key, kind, payload, at) tuple in binary COPY format, as the staging table takes it."""
    k, c = key.encode(), kind.encode()
    return b"".join((_STAGE_FIELDS.pack(4, len(k)), k, struct.pack(">i", len(c)), c,
                     struct.pack(">i", len(payload)), payload, _INT8_FIELD.pack(8, at_ms)))


def direct_record(key: str, kind: str, payload: bytes, at_ms: int, now_ms: int) -> bytes:
    """A tuple for ``bulk_copy_direct`` (the queue table's own columns)."""
    k, c = key.encode(), kind.encode()
    return b"".join((_STAGE_FIELDS.pack(6, len(k)), k, struct.pack(">i", len(c)), c,
                     struct.pack(">i", len(payload)), payload, _INT8_FIELD.pack(8, at_ms),
                     _INT8_FIELD.pack(8, at_ms), _INT8_FIELD.pack(8, now_ms)))


@dataclass
class BulkCounts:
    """Outcomes of the rows merged so far; every staged row lands in exactly one."""

    created: int = 0
    updated: int = 0
    ignored: int = 0

    @property
    def total(self) -> int:
        return self.created + self.updated + self.ignored

    def add(self, other: BulkCounts) -> None:
        self.created += other.created
        self.updated += other.updated
        self.ignored += other.ignored


class BulkWriter:
    """One dedicated connection, its TEMP staging table, and the merge policy.

    ``write(data, rows)`` takes ``rows`` binary COPY tuples (no header: :func:`copy_record`
    or the same bytes built elsewhere); a merge runs whenever ``flush_rows`` are staged, and on
    :meth:`close` (or leaving the ``with`` block without an error). :attr:`counts` are final
    after that.
    """

    def __init__(
        self,
        database: Database | str,
        *,
        table: str = "delayed_queue",
        can_update: bool = False,
        flush_rows: int = FLUSH_ROWS,
    ) -> None:
        if not isinstance(flush_rows, int) or flush_rows < 1:
            raise InvalidInput(f"flush_rows must be a positive int, got {flush_rows!r}")
        self.queries = Queries(table)
        self.can_update = can_update
        self.flush_rows = flush_rows
        self.counts = BulkCounts()
        self._owned = isinstance(database, str)
        self._db = Database(database, max_size=1) if isinstance(database, str) else database
        self._conn: psycopg.Connection[Any] | None = None
        self._staged = 0

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            conn = self._db.connect()
            try:
                conn.execute(self.queries["bulk_session_setup"])
                conn.execute(self.queries["bulk_stage_create"])
            except psycopg.Error as exc:
                conn.close()
                raise translate(exc, self._db.url) from exc
            self._conn = conn
        return self._conn

    def write(self, data: bytes | memoryview | Iterable[bytes | memoryview], rows: int) -> None:
        """Stage ``rows`` tuples (one buffer, or an iterable of buffers); merge when full."""
        if rows <= 0:
            return
        conn = self._connection()
        try:
            with conn.cursor().copy(self.queries["bulk_stage_copy"]) as copy:
                copy.write(COPY_HEADER)
                for part in [data] if isinstance(data, bytes | memoryview) else data:
                    copy.write(part)
                copy.write(COPY_TRAILER)
        except psycopg.Error as exc:
            raise translate(exc, self._db.url) from exc
        self._staged += rows
        if self._staged >= self.flush_rows:
            self.flush()

    def flush(self) -> BulkCounts:
        """Merge what is staged (one statement) and empty the stage; returns this merge's counts."""
        if not self._staged or self._conn is None:
            return BulkCounts()
        merged = self._merge(self._conn)
        if merged.total != self._staged:
            raise DatabaseError(f"bulk merge counted {merged.total} of {self._staged} staged rows")
        try:
            self._conn.execute(self.queries["bulk_stage_truncate"])
        except psycopg.Error as exc:
            raise translate(exc, self._db.url) from exc
        self._staged = 0
        self.counts.add(merged)
        return merged

    def _merge(self, conn: psycopg.Connection[Any]) -> BulkCounts:
        params = {"now": None}
        for attempt in range(MERGE_ATTEMPTS):
            try:
                if not self.can_update:
                    created = conn.execute(self.queries["bulk_merge_ignore"], params).rowcount
                    return BulkCounts(created, 0, self._staged - created)
                rows = conn.execute(self.queries["bulk_merge_update"], params).fetchall()
                created = sum(1 for (new,) in rows if new)
                return BulkCounts(created, len(rows) - created, self._staged - len(rows))
            except pg_errors.DeadlockDetected as exc:
                if attempt == MERGE_ATTEMPTS - 1:
                    raise translate(exc, self._db.url) from exc
            except psycopg.Error as exc:
                raise translate(exc, self._db.url) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Release the connection (its staging table goes with it) without merging."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._owned:
            self._db.close()

    def __enter__(self) -> BulkWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()


def copy_direct(database: Database, table: str, data: Iterable[bytes]) -> None:
    """Binary COPY straight into the queue table: no conflict handling, for benchmarks only
    (the raw write limit); tuples from :func:`direct_record`."""
    queries = Queries(table)
    with database.connect() as conn:
        try:
            with conn.cursor().copy(queries["bulk_copy_direct"]) as copy:
                copy.write(COPY_HEADER)
                for part in data:
                    copy.write(part)
                copy.write(COPY_TRAILER)
        except psycopg.Error as exc:
            raise translate(exc, database.url) from exc
