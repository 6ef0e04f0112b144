"""Text search over task arguments: a scan that keeps going by default, a trigram index opt-in.

Measured on 5M rows (~4 GB, docs/benchmarks.md, web): any scan of the whole table takes seconds
to minutes here (a byte search of every payload: 6-16 s; decoding them in SQL: minutes), so no
scan can say "no match" within 5 s. Two modes, then:

* **default, no index**: the task list scans in ETA order, in time slices (about a second per
  request, see ``tasks.service``), and the page continues by itself slice after slice,
  showing "searched up to ETA X", until its page is full or the end proves there is no match.
  The table keeps exactly its three indexes and publishing pays nothing.
* **opt-in** (``delayq tasks search-index create``): a GIN trigram index on the searchable text
  of each payload (:func:`searchable` is its Python twin). A search then answers from the index
  in milliseconds wherever its matches are, and "no match" at once; each publish pays for the
  index entries (measured in bench/bench_web.py).

Either way the database only narrows: each candidate is checked exactly by the caller.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from ..queue.delayed_queue import DelayedQueue
from ..queue.validate import validate_kind
from .inspector import TaskRow

#: What the index (and the scan's byte test) can look for: runs of characters every encoder
#: writes as they are (no quotes, backslashes, spaces, slashes or non-ASCII).
PLAIN_RE = re.compile(rb"[A-Za-z0-9_.@-]+")
#: Trigram indexes need three characters to narrow anything.
MIN_PIECE = 3
_BODY = b'"body": "'
#: An index search slower than this (ms) gives way to the scan (see :func:`indexed_window`).
INDEX_TIME_LIMIT_MS = 500


def plain_piece(text: str) -> bytes | None:
    """The longest plain run of ``text``, lower-cased: every payload matching ``text``
    contains it (in its searchable form); None when there is no usable one."""
    pieces = PLAIN_RE.findall(text.encode("utf-8", "replace"))
    best = max(pieces, key=len, default=b"")
    return best.lower() if len(best) >= MIN_PIECE else None


def searchable(payload: bytes) -> bytes:
    """A payload's searchable bytes, as the index's SQL function computes them: a kombu
    message's base64 body decoded (a Celery task's arguments), else the payload itself."""
    start = payload.find(_BODY)
    if start >= 0:
        start += len(_BODY)
        end = payload.find(b'"', start)
        try:
            return base64.b64decode(payload[start:end], validate=True)
        except (binascii.Error, ValueError):
            return payload
    return payload


def may_match(payload: bytes | None, piece: bytes | None) -> bool:
    """Cheap byte test before a full decode (False means it cannot match)."""
    return piece is None or (payload is not None and piece in searchable(payload).lower())


def index_ready(queue: DelayedQueue) -> bool:
    """Whether the opt-in trigram index exists and is valid."""
    row = queue.db.fetchone(queue.queries["search_index_valid"])
    return bool(row and row[0])


def create_index(queue: DelayedQueue) -> None:
    """Create the opt-in index (the pg_trgm extension, the function, the index built
    CONCURRENTLY: publishing goes on meanwhile). Idempotent; an invalid leftover of a failed
    build is dropped first."""
    q = queue.queries
    row = queue.db.fetchone(q["search_index_valid"])
    if row is not None and not row[0]:
        queue.db.execute(q["search_index_drop"])
    for name in ("search_extension", "search_fn_create", "search_index_create"):
        queue.db.execute(q[name])


def drop_index(queue: DelayedQueue) -> None:
    """Back to the table's three indexes: the opt-in index and its function go."""
    queue.db.execute(queue.queries["search_index_drop"])
    queue.db.execute(queue.queries["search_fn_drop"])


def like_pattern(piece: bytes) -> str:
    text = piece.decode("ascii")
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def indexed_window(queue: DelayedQueue, kinds: Sequence[str], *, piece: bytes,
                   after: tuple[int, int], lo: int, hi: int, budget: int) -> list[TaskRow] | None:
    """The next ``budget`` rows after ``after`` whose searchable text holds ``piece``, from
    the trigram index, in (scheduledAt, id) order, payloads included.

    None when the index would take longer than :data:`INDEX_TIME_LIMIT_MS`: a text found in
    most rows makes the index read (and recheck) all of them before it can sort, where a scan
    in ETA order finds such a text at once."""
    q = queue.queries
    params = {"kinds": [validate_kind(k) for k in kinds], "after_at": int(after[0]),
              "after_id": int(after[1]), "lo": int(lo), "hi": int(hi), "budget": int(budget),
              "pattern": like_pattern(piece), "now": queue.clock_ms()}

    def work(conn: psycopg.Connection[Any]) -> list[Any] | None:
        try:
            with conn.transaction():
                conn.execute(q["search_time_limit"], {"limit_ms": str(INDEX_TIME_LIMIT_MS)})
                return conn.execute(q["search_indexed"], params).fetchall()
        except pg_errors.QueryCanceled:
            return None

    rows = queue.db.run(work)
    return None if rows is None else [TaskRow.from_row(r) for r in rows]
