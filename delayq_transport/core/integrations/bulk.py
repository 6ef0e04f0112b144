"""Bulk offers at the speed of COPY: binary COPY into a staging table, one merge per flush.

``DelayedQueue.offer_batch`` sends rows as arrays in one ``INSERT ... SELECT unnest(...)``;
for millions of rows (the Spark pipeline) the client cost of building those arrays dominates.
A :class:`BulkWriter` instead takes rows already in PostgreSQL's binary COPY tuple format
(built by the caller, e.g. in Spark's JVM, or by :func:`copy_record`), streams them into a
per-connection TEMP table, and merges every ``flush_rows`` rows into the queue table with one
``INSERT ... SELECT ... ON CONFLICT`` (``bulk_merge_ignore`` / ``bulk_merge_update``).

Guarantees: outcomes are counted exactly per merge (created = rows inserted; with updates,
``RETURNING`` tells created from updated; every other staged row was ignored). Without a run,
each merge is one autocommit statement, so a writer that dies mid-way leaves whole merges
behind and a re-run finds their keys (idempotent by ``(key, kind)``, while the rows wait).
With a :class:`~..ledgers.runs.RunPart`, the writer applies one part of a run in **one
transaction**: the staging table, every merge and the part's entry in the run ledger commit
together, so a part is applied and recorded, or neither; a part already recorded writes nothing (its
rows are only counted, to check they are the ones recorded: :mod:`..ledgers.runs`). Behind a
transaction pooler (PgBouncer) nothing of a session outlives a transaction, so a writer always works
in one transaction there: the staging table is made in it, and dropped before its commit (the server
session goes on to other clients), and no session setting is made. Client memory is one caller
chunk; the staged rows live in PostgreSQL until their merge.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from ..db.database import Database, translate
from ..db.errors import DatabaseError, InvalidInput
from ..db.queries import Queries
from ..ledgers.runs import (
    Recorded,
    RunPart,
    add_fingerprints,
    check_part,
    part_recorded,
    record_part,
)

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
    #: Rows of a run's part that was applied before (nothing written).
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.created + self.updated + self.ignored + self.skipped

    def add(self, other: BulkCounts) -> None:
        self.created += other.created
        self.updated += other.updated
        self.ignored += other.ignored
        self.skipped += other.skipped


class BulkWriter:
    """One dedicated connection, its TEMP staging table, and the merge policy.

    ``write(data, rows)`` takes ``rows`` binary COPY tuples (no header: :func:`copy_record`
    or the same bytes built elsewhere); a merge runs whenever ``flush_rows`` are staged, and on
    :meth:`finish` (or leaving the ``with`` block without an error). :attr:`counts` are final
    after that. With ``run``, nothing is visible before :meth:`finish` commits, and each
    ``write`` also takes the fingerprint of its tuples' keys
    (:func:`..ledgers.runs.add_fingerprints`).
    """

    def __init__(
        self,
        database: Database | str,
        *,
        table: str = "delayed_queue",
        can_update: bool = False,
        flush_rows: int = FLUSH_ROWS,
        run: RunPart | None = None,
    ) -> None:
        if not isinstance(flush_rows, int) or flush_rows < 1:
            raise InvalidInput(f"flush_rows must be a positive int, got {flush_rows!r}")
        self.queries = Queries(table)
        self.can_update = can_update
        self.flush_rows = flush_rows
        self.run = run
        self.counts = BulkCounts()
        #: Set when ``run``'s part was found applied before: writes are only counted then.
        self.recorded: Recorded | None = None
        self._owned = isinstance(database, str)
        self._db = Database(database, max_size=1) if isinstance(database, str) else database
        self._conn: psycopg.Connection[Any] | None = None
        #: One transaction from the staging table to the commit: a run's part, or any write
        #: behind a transaction pooler.
        self._transactional = run is not None or self._db.transaction_pooling
        self._opened = self._finished = False
        self._staged = 0
        self._rows = 0  # tuples handed to write(), and their fingerprint (run mode)
        self._fingerprint = 0

    def _open(self) -> psycopg.Connection[Any] | None:
        """The connection with its staging table; None when the run's part is already in.

        In run mode the part's transaction starts with the staging table: a TRUNCATE of a
        table made in the same transaction empties it in place, where one made before would
        keep every flush's old file until the commit.
        """
        if self._opened:
            return self._conn
        conn = self._db.connect()
        try:
            if not self._db.transaction_pooling:  # a session setting: see the module docstring
                conn.execute(self.queries["bulk_session_setup"])
            if self.run is not None:
                self.recorded = part_recorded(conn, self.queries, self.run)
                if self.recorded is not None:
                    conn.close()
                    self._opened = True
                    return None
            if self._transactional:
                conn.autocommit = False
            conn.execute(self.queries["bulk_stage_create"])
        except psycopg.Error as exc:
            conn.close()
            raise translate(exc, self._db.url) from exc
        self._conn, self._opened = conn, True
        return conn

    def write(self, data: bytes | memoryview | Iterable[bytes | memoryview], rows: int,
              fingerprint: int = 0) -> None:
        """Stage ``rows`` tuples (one buffer, or an iterable of buffers); merge when full."""
        if rows <= 0:
            return
        self._rows += rows
        if self.run is not None:
            self._fingerprint = add_fingerprints(self._fingerprint, fingerprint)
        conn = self._open()
        if conn is None:
            return
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

    def finish(self) -> BulkCounts:
        """Merge what is left; in run mode, record the part and commit, or (the part was in
        already) check that it holds the same records. Returns the final :attr:`counts`."""
        if self.run is None:
            self.flush()
            if self._transactional and self._conn is not None:
                try:
                    self._commit(self._conn)
                except psycopg.Error as exc:
                    raise translate(exc, self._db.url) from exc
                self._conn.close()  # a later write opens a new transaction and stage
                self._conn, self._opened = None, False
            return self.counts
        if self._finished:
            return self.counts
        conn = self._open()
        if conn is not None:
            self.flush()
            try:
                if record_part(conn, self.queries, self.run, self._rows, self._fingerprint):
                    self._commit(conn)
                    self._finished = True
                    return self.counts
                conn.rollback()  # another attempt of this part committed first
                self.recorded = part_recorded(conn, self.queries, self.run)
                conn.rollback()
            except psycopg.Error as exc:
                raise translate(exc, self._db.url) from exc
        assert self.recorded is not None
        check_part(self.run, self.recorded, self._rows, self._fingerprint)
        self.counts = BulkCounts(skipped=self._rows)
        self._finished = True
        return self.counts

    def _commit(self, conn: psycopg.Connection[Any]) -> None:
        if self._db.transaction_pooling:  # leave no table in a session lent to others next
            conn.execute(self.queries["bulk_stage_drop"])
        conn.commit()

    def _merge(self, conn: psycopg.Connection[Any]) -> BulkCounts:
        params = {"now": None}
        # In a run's transaction a deadlock aborts the whole part: no retry here (the part
        # is rolled back and unrecorded; Spark's task retry or a re-run applies it).
        attempts = 1 if self._transactional else MERGE_ATTEMPTS
        for attempt in range(attempts):
            try:
                if not self.can_update:
                    created = conn.execute(self.queries["bulk_merge_ignore"], params).rowcount
                    return BulkCounts(created, 0, self._staged - created)
                rows = conn.execute(self.queries["bulk_merge_update"], params).fetchall()
                created = sum(1 for (new,) in rows if new)
                return BulkCounts(created, len(rows) - created, self._staged - len(rows))
            except pg_errors.DeadlockDetected as exc:
                if attempt == attempts - 1:
                    raise translate(exc, self._db.url) from exc
            except psycopg.Error as exc:
                raise translate(exc, self._db.url) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Release the connection (its staging table goes with it) without merging; in run
        mode, without committing (the part stays unapplied and unrecorded)."""
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
                self.finish()
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
