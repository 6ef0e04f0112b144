"""Wake-ups sent after the publishes' commits, at most one per short window, complete.

A NOTIFY inside the publishing transaction takes PostgreSQL's cluster-wide notify lock at
commit and holds it until the commit record is written, so notifying commits queue behind one
another and cannot share a WAL flush: four publishers reached 7,520-7,870 inserts/s without it
and 3,750-4,370 with it, at exactly one flush per commit (issue 27). So a process sends its
wake-ups in at most one commit per window: the publish that finds the window over opens the
next one and carries the wake-up in its own statement (``offer_insert`` and
``offer_batch_insert`` take ``announce`` and ``pending``), a NOTIFY of its rows and of the rows
this process committed since the last wake-up, delivered by its own commit, so it costs neither
a round trip nor a transaction of its own. The publishes within the window hand
``(kind, scheduledAt)`` to the announcer after their commits; the first publish after the
window's end carries them, and when none comes within a window of the first of them, the
announcer's thread sends them (statement ``announce``) on an idle pooled connection.

What is coalesced is the commits, never the due times: a wake-up lists **every distinct**
``scheduledAt`` of each kind (``kind:ms``, one notification each), so a consumer knows every
due time it was told about and sets its timer to each in turn. The version before sent only
the earliest time per kind and window; the later rows of a burst of countdowns were learnt
only by a next-due search, which a consumer runs at most every few seconds, and ran up to
160 ms late (issue 41). Past :data:`MAX_LISTED` distinct times of one kind in one wake-up
(a batch of thousands, a beat install), the rest are not listed one by one: a **search
marker** (:func:`marker_payload`, the first time left out) tells the consumers to search the
table for the next due time once that time comes, and on from each row they find
(core/queue/watermark.py): bounded notifications, and still no due time lost. Statements of other
writers (COPY, bulk merges: the insert trigger of migration 14) announce the same way.

A publish that commits no row (its key exists, an error) gives back what it was to carry.
Never a connection of its own: a publishing process holds what it held
(docs/how-to/managed-service.md, *Connections*). Should the process die between a commit and
its announcement, the consumers find the row on their fallback poll (``polling_interval``)
instead; the announcements still waiting at interpreter exit or at :meth:`Announcer.close` are
sent first.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from ..db.database import cursor_of
from ..db.errors import DelayqError
from .validate import RESERVED_KIND_PREFIX

if TYPE_CHECKING:
    from ..db.database import Database
    from ..db.queries import Queries

log = logging.getLogger(__name__)

#: Shortest time between two announcements of one process. A row published right after one
#: waits at most this long for its wake-up (when its consumer is idle); under load it is what
#: turns a notifying commit per publish into a few hundred per second per process at most.
DEFAULT_WINDOW_S = 0.005
#: How long the thread waits for an idle pooled connection before it takes one anyway.
IDLE_WAIT_S = 0.02
#: Most distinct due times of one kind listed one by one in a wake-up; the rest are covered by
#: one search marker (see the module docstring). 1,000 notifications of ~40 bytes: one
#: commit's worth at the highest publish rates measured, far below the 8 GB notify queue.
MAX_LISTED = 1000
#: Starts a search marker's payload (``\x1ekind:ms``). No consumer takes it for a kind of its
#: own (a kind starting with it is refused by validate_kind), and a consumer that predates it
#: parses it as a due time of a kind it does not consume, which changes nothing there.
MARKER_PREFIX = RESERVED_KIND_PREFIX


class Wakeups:
    """Due times to announce, per kind: every distinct one up to :data:`MAX_LISTED`, and from
    where the rest must be searched (the earliest time not listed). Invariant: every time
    added is listed or at or after the kind's marker, so nothing added can be missed."""

    __slots__ = ("times", "marks")

    def __init__(self) -> None:
        self.times: dict[str, set[int]] = {}
        self.marks: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.times) or bool(self.marks)

    def add(self, rows: Iterable[tuple[str, int]]) -> None:
        for kind, at in rows:
            mark = self.marks.get(kind)
            if mark is not None and at >= mark:
                continue  # the search from the marker finds it
            listed = self.times.setdefault(kind, set())
            listed.add(at)
            if len(listed) > MAX_LISTED:
                latest = max(listed)
                listed.discard(latest)
                self.marks[kind] = latest if mark is None else min(mark, latest)

    def update(self, other: Wakeups) -> None:
        for kind, listed in other.times.items():
            self.add((kind, at) for at in listed)
        for kind, mark in other.marks.items():
            self.mark(kind, mark)

    def mark(self, kind: str, at: int) -> None:
        """Rows of ``kind`` from ``at`` on are not listed: search from there."""
        mark = self.marks.get(kind)
        self.marks[kind] = at if mark is None else min(mark, at)

    def payloads(self) -> list[str]:
        """Notification payloads: ``kind:ms`` per listed time (what core/queue/listen.py parses),
        then :func:`marker_payload` per kind that has a marker."""
        out = [f"{kind}:{at}" for kind, listed in self.times.items() for at in sorted(listed)]
        out.extend(marker_payload(kind, at) for kind, at in self.marks.items())
        return out


def marker_payload(kind: str, at: int) -> str:
    """A search marker: rows of ``kind`` due at ``at`` and later were not listed."""
    return f"{MARKER_PREFIX}{kind}:{at}"


class Announcer:
    """One process' wake-ups for one table (one per root :class:`~.delayed_queue.DelayedQueue`)."""

    def __init__(self, db: Database, queries: Queries, window_s: float = DEFAULT_WINDOW_S
                 ) -> None:
        self.db = db
        self.statement = queries["announce"]
        self.window_s = window_s
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        """Fresh state for this process (a forked child inherits neither the thread nor a
        usable lock)."""
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        #: What committed rows no wake-up carried yet.
        self._pending = Wakeups()
        self._last_sent = -float("inf")
        #: When the oldest wake-up pending now was noted: the thread sends it a window later.
        self._pending_since = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    def take(self) -> Wakeups | None:
        """Before an insert: None while the window is open (the caller passes its rows to
        :meth:`note` after the commit); else the window starts now, and the insert carries the
        wake-up in its own statement, for its rows and for the earlier rows pending here
        (returned, maybe none). Given back with :meth:`restore` should that transaction not
        commit a row."""
        if self._pid != os.getpid():
            self._reset()
        with self._cond:
            now = time.monotonic()
            if now < self._last_sent + self.window_s and not self._closed:
                return None
            pending, self._pending, self._last_sent = self._pending, Wakeups(), now
            return pending

    def note(self, rows: Iterable[tuple[str, int]]) -> None:
        """Committed rows ``(kind, scheduledAt)`` that no wake-up carried: sent by a later
        publish, or by the thread at the window's end."""
        self._gather(lambda pending: pending.add(rows))

    def restore(self, carried: Wakeups) -> None:
        """The transaction that was to carry these wake-ups committed no row: they wait again."""
        self._gather(lambda pending: pending.update(carried))

    def _gather(self, add: Callable[[Wakeups], None]) -> None:
        if self._pid != os.getpid():
            self._reset()
        with self._cond:
            was_empty = not self._pending
            add(self._pending)
            self._kick(was_empty)

    def _kick(self, was_empty: bool) -> None:
        """Under the lock, after rows were added: start the thread, or wake it when it waits
        for work. A thread already waiting for the window's end is left alone: waking it for
        every publish of a window cost a thread switch per publish."""
        if not self._pending:
            return
        if was_empty:
            self._pending_since = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="delayq-announce",
                                            daemon=True)
            self._thread.start()
        elif was_empty:
            self._cond.notify()

    def due(self, rows: Iterable[tuple[str, int]]) -> list[str] | None:
        """Record committed rows ``(kind, scheduledAt)``; the payloads the caller must send now
        (:meth:`send_on` its connection), or None when the window is still open (they are sent
        with a later publish, or by the thread at the window's end)."""
        if self._pid != os.getpid():
            self._reset()
        with self._cond:
            now = time.monotonic()
            was_empty = not self._pending
            self._pending.add(rows)
            if now >= self._last_sent + self.window_s or self._closed:
                if not self._pending:
                    return None
                batch, self._pending, self._last_sent = self._pending, Wakeups(), now
                return batch.payloads()
            self._kick(was_empty)
            return None

    def send_on(self, conn: psycopg.Connection[Any], payloads: list[str]) -> None:
        """Send ``payloads`` on the caller's connection, after the commit of its rows."""
        try:
            cursor_of(conn).execute(self.statement, {"payloads": payloads})
            if conn.pgconn.transaction_status != TransactionStatus.IDLE:
                conn.commit()  # behind a transaction pooler the connection opened one
        except psycopg.Error as exc:  # the rows are committed: never fail their publish
            log.warning("delayq: could not announce %d new row(s) (their consumers find them "
                        "on their next fallback poll): %s", len(payloads), exc)

    def _run(self) -> None:
        """Nobody published for a window after a wake-up was left pending: send what gathered,
        on an idle pooled connection (waiting up to :data:`IDLE_WAIT_S` for one, so as not to
        open another). Not at the window's end: publishes that keep coming carry them (the
        first one after the window's end), which a thread sending at the window's end
        pre-empted nearly every time at a few hundred publishes per second, a transaction
        each. A row's wake-up waits at most a window either way."""
        cond = self._cond
        while True:
            with cond:
                while not self._pending and not self._closed:
                    cond.wait()
                if not self._pending:
                    return  # closed, nothing left
                wait = (max(self._last_sent, self._pending_since) + self.window_s
                        - time.monotonic())
                if wait > 0 and not self._closed:
                    cond.wait(wait)  # a publish may send it meanwhile
                    continue
            self._wait_for_idle_connection()
            self.flush()

    def _wait_for_idle_connection(self) -> None:
        """Until a pooled connection is idle, or nothing is pending any more (a publish carried
        it). A connection is opened for a wake-up only when the pool has none open after
        IDLE_WAIT_S (rows committed on the caller's connection): a busy one is busy with
        delayq's own short statements, and growing the pool for a NOTIFY broke the documented
        budget (a prefork child held two connections beside its publishes; issue 43's
        connection-budget test saw 29-30 against 28)."""
        deadline = time.monotonic() + IDLE_WAIT_S
        pool = self.db.pool if not self.db.has_relaxed_pool else self.db.relaxed_pool
        while not self._closed and not self.db.closed:
            stats = pool.get_stats()
            if stats.get("pool_available", 0) > 0 or not self._pending:
                return
            if time.monotonic() >= deadline and stats.get("pool_size", 0) == 0:
                return
            time.sleep(0.001)

    def flush(self) -> None:
        """Send what is pending now, on a pooled connection (the thread, close, exit)."""
        if self._pid != os.getpid():
            return
        with self._cond:
            batch, self._pending = self._pending, Wakeups()
            if batch:
                self._last_sent = time.monotonic()
        if batch:
            self._send_pooled(batch.payloads())

    def announce(self, rows: Iterable[tuple[str, int]]) -> None:
        """Rows committed without a connection at hand to send on: as :meth:`due`, sending on
        a pooled connection when the window is over."""
        payloads = self.due(rows)
        if payloads:
            self._send_pooled(payloads)

    def _send_pooled(self, payloads: list[str]) -> None:
        if self.db.closed:
            log.debug("delayq: %d announcement(s) after the database was closed", len(payloads))
            return
        try:
            # On the pool the publishes use: the relaxed one (nothing to flush) once open.
            self.db.run(lambda conn: self.send_on(conn, payloads),
                        relaxed=self.db.has_relaxed_pool)
        except DelayqError as exc:  # the consumers' fallback poll finds these rows instead
            log.warning("delayq: could not announce %d new row(s) (their consumers find them "
                        "on their next fallback poll): %s", len(payloads), exc)

    def close(self) -> None:
        """Send what is pending and stop the thread (the database is still open)."""
        if self._pid != os.getpid():
            return
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.flush()
        _LIVE.discard(self)


def payloads(carried: Wakeups | None) -> list[str]:
    """What an insert that carries the wake-up passes as ``pending`` (nothing: none)."""
    return carried.payloads() if carried else []


_LIVE: weakref.WeakSet[Announcer] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """A script that publishes and exits at once still wakes the consumers at once."""
    for announcer in list(_LIVE):
        try:
            announcer.flush()
        except Exception as exc:  # a closed database: nothing to be done at exit
            log.debug("delayq: announcements lost at exit: %s", exc)
