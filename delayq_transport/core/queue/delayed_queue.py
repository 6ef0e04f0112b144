"""DelayedQueue: messages kept in PostgreSQL until their ``scheduledAt``.

The data model and the choices behind it: docs/explanation/design.md. In short: acquiring is
one statement (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)``),
"now" is one clock (the database's unless a test injects one), and rows are only ever moved
(lease, release), never copied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from ..db.database import Database, as_arrays
from ..db.errors import InvalidInput
from ..db.queries import Queries
from ..db.rows import PolledRow
from ..schema.migrations import ensure_schema as ensure_current_schema
from .announce import MARKER_PREFIX, Announcer
from .controls import UNCHANGED, Control, Controls, ControlUse, Naming, controls_use, set_control
from .counts import COUNT_CAP, capped_status, count_due
from .leases import new_lock
from .offer import Offering
from .once import OnceOffering
from .timeutil import duration_ms, from_ms, to_ms
from .types import Envelope, KindStatus, StoredMessage
from .validate import (
    validate_key,
    validate_kind,
)
from .watermark import DEFAULT_FULL_RESCAN_INTERVAL_S, LowWatermarks, next_search_interval

DEFAULT_ACQUIRE_TIMEOUT_S = 60.0

Clock = Callable[[], datetime]


class DelayedQueue(Offering, OnceOffering):
    """One partition (``kind``) of a ``delayed_queue`` table; thread-safe.

    Instances for other kinds of the same table share the pool via :meth:`with_kind`.

    Parameters:
      database: a libpq URL (the queue opens and closes its own pool) or a shared
        ``Database``.
      owns_database: close the ``Database`` given with the queue (and when the queue's
        construction fails): a pool made for this queue alone and handed over.
      kind: the partition this queue offers to and polls (``pKind``).
      table: the queue table (a validated identifier).
      acquire_timeout: lease of a polled message (seconds or a timedelta); an unacknowledged
        message is due again when it lapses.
      clock: "now" for every statement instead of the database clock (tests).
      ensure_schema: read the migrations ledger on open and migrate only what is missing.
      pool_max_size: most connections of the pool made from a URL.
      relaxed_consumer_commits: polls, acks, lease extensions and releases commit without
        waiting for the WAL flush (a crash can then only redeliver).
      low_watermark: start polls at this consumer's per-kind floor instead of the bottom of
        the index; only sound for a consumer that feeds it NOTIFYs (the transports do).
      full_rescan_interval: with ``low_watermark``, seconds between probes below the floor.
      naming: which queue names select a kind and where its tasks carry a limit key (the
        front end's ``formats/queues.py``): how a consumer finds its controlled kinds.
    """

    def __init__(
        self,
        database: Database | str,
        *,
        kind: str = "default",
        table: str = "delayed_queue",
        acquire_timeout: timedelta | float = DEFAULT_ACQUIRE_TIMEOUT_S,
        clock: Clock | None = None,
        ensure_schema: bool = True,
        pool_max_size: int = 8,
        relaxed_consumer_commits: bool = False,
        low_watermark: bool = False,
        full_rescan_interval: float = DEFAULT_FULL_RESCAN_INTERVAL_S,
        owns_database: bool = False,
        naming: Naming | None = None,
    ) -> None:
        self.kind = validate_kind(kind)
        self.queries = Queries(table)
        self.table = table
        self.lease_ms = duration_ms(acquire_timeout, what="acquire_timeout")
        if self.lease_ms <= 0:
            raise InvalidInput("acquire_timeout must be positive")
        self.clock = clock
        #: Acquire/ack/lease/release commit without waiting for the WAL flush: a server crash
        #: can then only cause redeliveries (at-least-once). Publishing is chosen per offer.
        self.relaxed = relaxed_consumer_commits
        #: Per-kind scan floors of this consumer (core/queue/watermark.py), shared by ``with_kind``
        #: clones. Off by default: rows offered in the past by *another* process are then only
        #: found once a NOTIFY lowers the floor (the transport forwards them) or the probe
        #: below the floor runs, so it is for consumers that listen.
        self.watermarks = (
            LowWatermarks(self._probe_below, full_rescan_interval,
                          next_search_interval_s=next_search_interval(self.lease_ms))
            if low_watermark else None
        )
        #: Which kinds polled are controlled (core/queue/controls.py), shared by clones.
        self._controls = Controls(self, naming)
        self._owns_db = owns_database or isinstance(database, str)
        self.db = (
            Database(database, max_size=pool_max_size) if isinstance(database, str) else database
        )
        #: Wake-ups of this process' publishes, sent after their commits (core/queue/announce.py).
        self.announcer = Announcer(self.db, self.queries)
        #: Concurrent offers share one insert and commit, per durability (core/queue/combine.py).
        self._combiners = self._make_combiners()
        self._root = True
        if ensure_schema:
            try:
                ensure_current_schema(self.db, table)
            except BaseException:
                self.close()
                raise

    # -- construction -----------------------------------------------------------------

    def with_kind(self, kind: str) -> DelayedQueue:
        """The same table and pool, another partition."""
        clone = object.__new__(DelayedQueue)
        clone.__dict__.update(self.__dict__)
        clone.kind = validate_kind(kind)
        clone._owns_db = False
        clone._root = False
        return clone

    def close(self) -> None:
        """Send the wake-ups still pending (the root queue; clones share it), close the pool
        if this queue made it."""
        if self._root:
            self.announcer.close()
        if self._owns_db:
            self.db.close()

    def __enter__(self) -> DelayedQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- clock ------------------------------------------------------------------------

    def clock_ms(self) -> int | None:
        """The injected clock's time in epoch ms, or None to let SQL use the database clock:
        the ``now`` parameter of every statement that reads the clock."""
        return None if self.clock is None else to_ms(self.clock(), what="clock()")

    _now_ms = clock_ms  # the name Offering (core/queue/offer.py) calls it by

    def now(self) -> datetime:
        """The queue's notion of now (database clock unless injected)."""
        if self.clock is not None:
            return self.clock()
        row = self.db.fetchone(self.queries["db_now"], {"now": None})
        assert row is not None
        return from_ms(row[0])

    def _kinds(self, kinds: Sequence[str] | None) -> list[str]:
        return [self.kind] if kinds is None else [validate_kind(k) for k in kinds]

    # -- poll / ack -------------------------------------------------------------------

    def try_poll(self) -> Envelope | None:
        """Acquire the earliest due message of this kind, or None."""
        found = self.try_poll_many(1)
        return found[0] if found else None

    def try_poll_many(self, n: int, kinds: Sequence[str] | None = None) -> list[Envelope]:
        """Acquire up to ``n`` due messages in one statement, all under one lock id.

        ``kinds`` (default: this queue's) are drained in the order given, which is how the
        transport maps priorities. Envelopes come back in delivery order.
        """
        return self.poll(n, kinds)[0] if n > 0 else []

    def poll(self, n: int, kinds: Sequence[str] | None = None) -> tuple[list[Envelope], int | None]:
        """``try_poll_many`` plus, from the same statement, the earliest ``scheduledAt`` (epoch
        ms, leases included) of the rows left: when a consumer should look again. With
        ``low_watermark`` it is searched only now and then, and the time reported in between
        is the last one found lowered by every announcement since (see
        ``core/queue/watermark.py``)."""
        kinds = self._kinds(kinds)
        routes = self._controls.routes(kinds)
        if routes is None:
            return self._poll(n, kinds)
        envelopes: list[Envelope] = []
        dues: list[int] = []
        for name, group in routes:
            if len(envelopes) >= n:
                break
            if name is None:
                envs, due = self._poll(n - len(envelopes), group)
            else:
                lock = new_lock()
                rows = self._controls.claim(name, group, n - len(envelopes), lock,
                                           self.lease_ms, True, self.relaxed)
                envs, due = self._envelopes(rows, lock)
            envelopes += envs
            dues += [] if due is None else [due]
        return envelopes, min(dues, default=None)

    # -- fleet-wide control (core/queue/controls.py, docs/how-to/limits.md) -------------------

    def pause(self, queue: str) -> Control:
        """Stop every worker of the fleet claiming tasks of ``queue`` (within a second);
        its waiting rows and countdowns stay as they are. Kept until :meth:`resume`."""
        return self._control(queue, paused=True)

    def resume(self, queue: str) -> Control:
        """Let the fleet claim ``queue``'s tasks again (within a second); its limits stay."""
        return self._control(queue, paused=False)

    def limit(self, queue: str, *, concurrency: int | None = UNCHANGED,
              key_concurrency: int | None = UNCHANGED, rate: str | None = UNCHANGED,
              key_rate: str | None = UNCHANGED) -> Control:
        """Set ``queue``'s fleet-wide limits (None removes one, what is not given stays): at
        most ``concurrency`` tasks held at once, ``rate`` claims (``"50/s"``, ``"100/m"``),
        and the same per limit key (``key_*``)."""
        return self._control(queue, concurrency=concurrency, key_concurrency=key_concurrency,
                             rate=rate, key_rate=key_rate)

    def _control(self, queue: str, **changes: Any) -> Control:
        """Change a control; this queue's own polls see it at once (others hear its wake-up)."""
        control = set_control(self, queue, **changes)
        self.controls_changed()
        return control

    def controls(self) -> list[ControlUse]:
        """Every controlled queue with what it holds now."""
        return controls_use(self)

    def controlled(self, kinds: Iterable[str]) -> list[str]:
        """Of ``kinds``, those whose acks free a concurrency slot (as last read: no statement)."""
        return self._controls.limited(kinds)

    def wake_claimers(self, kinds: Iterable[str]) -> None:
        """Tell every consumer of ``kinds`` that a slot is free: a wake-up due now of each, on
        a transaction of its own committed without waiting for the WAL flush."""
        self.db.execute(self.queries["announce"], {"payloads": [f"{k}:0" for k in kinds]},
                        relaxed=True)

    def controls_changed(self, heard: bool | None = None) -> None:
        """A control may have changed (its wake-up, or LISTEN lost): read them at the next
        poll; ``heard`` says whether changes will be heard from now on (else read them every
        second)."""
        self._controls.changed(heard)

    def _poll(self, n: int, kinds: list[str]) -> tuple[list[Envelope], int | None]:
        """The plain claim (``try_poll_many``): every queue without a control."""
        lock = new_lock()  # starts with this process' worker tag (core/queue/leases.py)
        marks = self.watermarks
        ticket = None if marks is None else marks.begin(kinds)
        params = {
            "kinds": kinds,
            "lows": [None] * len(kinds) if ticket is None else ticket.lows,
            "want_next": ticket is None or ticket.want_next,
            "limit": n,
            "lock": lock,
            "lease_ms": self.lease_ms,
            "now": self._now_ms(),
        }
        statement = self.queries.direct("try_poll_many")  # on libpq itself: core/db/direct.py

        def work(conn: psycopg.Connection[Any]) -> list[PolledRow]:
            return statement.rows(conn, params)  # type: ignore[return-value]  # core/db/rows.py

        try:
            rows = self.db.run(work, relaxed=self.relaxed)
        except BaseException:
            if ticket is not None:
                marks.abort(ticket)  # type: ignore[union-attr]
            raise
        # One row of the statement carries no message, only the next due time and its now.
        last = next((r for r in rows if r.id is None), None)
        next_due = None if last is None else last.next_due
        rows = [r for r in rows if r.id is not None]
        if ticket is not None:
            taken_max: dict[str, int] = {}
            for r in rows:
                taken_max[r.kind] = max(taken_max.get(r.kind, r.previous_at), r.previous_at)
            next_due = marks.finish(  # type: ignore[union-attr]
                ticket, taken_max, n, len(rows), None if last is None else last.polled_at,
                next_due)
        return self._envelopes(rows, lock, next_due)

    def _envelopes(self, rows: list[PolledRow], lock: str, next_due: int | None = None
                   ) -> tuple[list[Envelope], int | None]:
        """The polled rows as envelopes in delivery order, and when to look again (from the
        statement's last row, unless given)."""
        if next_due is None:
            last = next((r for r in rows if r.id is None), None)
            next_due = None if last is None else last.next_due
        rows = [r for r in rows if r.id is not None]
        rows.sort(key=_delivery_order)
        ack = self.ack
        envelopes = [
            Envelope(r.id, r.key, r.kind, bytes(r.payload), r.previous_at,  # type: ignore[arg-type]
                     r.scheduled_at_initially, r.created_at, lock,
                     r.previous_at > r.scheduled_at_initially, ack)
            for r in rows
        ]
        return envelopes, next_due

    def ack(self, envelope: Envelope) -> int:
        """Delete a delivered row, only if it is still held under this delivery's lock."""
        params = {"id": envelope.id, "lock": envelope.lock}
        return self.db.execute(self.queries["ack"], params, relaxed=self.relaxed)

    def ack_many(self, deliveries: Iterable[Envelope | tuple[int, str]]) -> int:
        """Delete many deliveries in one statement (two if the batch holds an id twice); each
        matches only its own (id, lock)."""
        return sum(self.db.execute(self.queries["ack_many"], params, relaxed=self.relaxed)
                   for params in self._by_pair(deliveries))

    def ack_lock(self, lock: str) -> int:
        """Delete every row still held under ``lock`` (all of one poll)."""
        return self.db.execute(self.queries["ack_lock"], {"lock": lock}, relaxed=self.relaxed)

    def extend_lease(self, locks: Iterable[str], lease: timedelta | float | None = None) -> int:
        """Push the lease of rows held under ``locks`` to now + lease; returns rows extended."""
        locks = sorted(set(locks))
        if not locks:
            return 0
        lease_ms = self.lease_ms if lease is None else duration_ms(lease, what="lease")
        params = {"locks": locks, "lease_ms": lease_ms, "now": self._now_ms()}
        return self.db.execute(self.queries["extend_lease"], params, relaxed=self.relaxed)

    def release(
        self, deliveries: Iterable[Envelope | tuple[int, str]], delay: timedelta | float = 0
    ) -> int:
        """Un-acquire in place: the rows become due again (after ``delay``), no copy is made."""
        delay_ms, released = duration_ms(delay, what="delay"), 0
        for params in self._by_pair(deliveries):
            params.update(delay_ms=delay_ms, now=self._now_ms())
            rows = self.db.fetchall(self.queries["release"], params, relaxed=self.relaxed)
            for kind, at in rows:
                self._lower(kind, at)
            released += len(rows)
        return released

    # -- low watermark ----------------------------------------------------------------

    def _lower(self, kind: str, at_ms: int) -> None:
        if self.watermarks is not None:
            self.watermarks.lower(kind, at_ms)

    def _probe_below(self, kinds: list[str], starts: list[int | None], floors: list[int]
                     ) -> list[tuple[str, int]]:
        """The watermark's safety net, run in its own thread (core/queue/watermark.py)."""
        params = {"kinds": kinds, "starts": starts, "floors": floors, "now": self._now_ms()}
        rows = self.db.fetchall(self.queries["probe_below_watermark"], params,
                                relaxed=self.relaxed)
        return [(kind, int(at)) for kind, at in rows]

    def disable_watermarks(self) -> None:
        """Scan from the bottom on every poll from now on: the low watermark is only sound
        while every publish is announced to this process (it is lowered by each NOTIFY), and
        a consumer whose LISTEN cannot deliver (behind a transaction pooler) hears none."""
        self.watermarks = None

    def lower_watermark(self, kind: str, at_ms: int) -> None:
        """A row of ``kind`` is due at ``at_ms`` (a NOTIFY said so): the next poll must not
        start above it. A ``kind`` that starts with the search marker's prefix (as
        core/queue/listen.py hands it on) marks rows from ``at_ms`` on that no notification listed:
        the next due time is searched for there. No-op without ``low_watermark``."""
        if self.watermarks is None:
            return
        if kind.startswith(MARKER_PREFIX):
            self.watermarks.lower(kind[len(MARKER_PREFIX):], at_ms, search=True)
        else:
            self.watermarks.lower(kind, at_ms)

    def reset_watermarks(self) -> None:
        """Notifications may have been missed (LISTEN reconnected): scan from the bottom."""
        if self.watermarks is not None:
            self.watermarks.reset()

    @staticmethod
    def _by_pair(deliveries: Iterable[Envelope | tuple[int, str]],
                 extra: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """Parameters of the statements matched on (id, lock): ack_many, release, dead_letter.

        They find each row's own lock by the position of its id (``array_position``: a join
        on the pairs made the planner compare every row with every pair), so one call holds
        an id once. A repeated id (the same row delivered twice, both deliveries in one batch)
        goes to a later call: only one of its locks can still match. ``extra`` (one value per
        delivery, e.g. dead_letter's payloads) follows its pair as ``extra``.
        """
        pairs = [(d.id, d.lock) if isinstance(d, Envelope) else (int(d[0]), str(d[1]))
                 for d in deliveries]
        values = [None] * len(pairs) if extra is None else list(extra)
        calls: list[tuple[set[int], list[tuple[int, str, Any]]]] = []
        for (id_, lock), value in zip(pairs, values, strict=True):
            call = next((c for c in calls if id_ not in c[0]), None)
            if call is None:
                call = (set(), [])
                calls.append(call)
            call[0].add(id_)
            call[1].append((id_, lock, value))
        out = []
        for _, rows in calls:
            ids, locks, extras = as_arrays(rows, 3)
            params = {"ids": ids, "locks": locks, "lock_set": sorted(set(locks))}
            if extra is not None:
                params["extra"] = extras
            out.append(params)
        return out

    # -- inspection and maintenance ---------------------------------------------------

    def contains(self, key: str) -> bool:
        """Whether a row with this key waits in this kind (or is in flight)."""
        return self.get(key) is not None

    def get(self, key: str) -> StoredMessage | None:
        """The row with this key in this kind, or None."""
        row = self.db.fetchone(self.queries["get"], {"key": validate_key(key), "kind": self.kind})
        return None if row is None else StoredMessage.from_row(row)

    def delete(self, key: str) -> bool:
        """Delete the row with this key in this kind, in flight or not; True if one was."""
        params = {"key": validate_key(key), "kind": self.kind}
        return self.db.execute(self.queries["delete"], params) > 0

    def delete_waiting(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        """Delete rows with these keys in any kind unless in flight; returns (key, kind) deleted."""
        keys = [validate_key(k) for k in keys]
        if not keys:
            return []
        rows = self.db.fetchall(self.queries["delete_waiting_by_keys"], {"keys": keys})
        return [(key, kind) for key, kind in rows]

    def purge(self, kinds: Sequence[str] | None = None) -> int:
        """Delete every waiting (due or scheduled) row of the kinds; in-flight rows stay."""
        return self.db.execute(self.queries["purge"], {"kinds": self._kinds(kinds)})

    def count_due(self, kinds: Sequence[str] | None = None, cap: int = COUNT_CAP) -> int:
        """Due rows of the kinds (kombu's queue size), exact up to ``cap``; bounded cost."""
        return count_due(self, self._kinds(kinds), cap)

    def count_waiting(self, kinds: Sequence[str] | None = None) -> int:
        """Every row of the kinds not in flight, due or not: an exact count, O(rows)."""
        row = self.db.fetchone(self.queries["count_waiting"], {"kinds": self._kinds(kinds)})
        return int(row[0]) if row else 0

    def next_due(self, kinds: Sequence[str] | None = None) -> datetime | None:
        """Earliest ``scheduledAt`` of the kinds as a datetime, leases included."""
        ms = self.next_due_ms(kinds)
        return None if ms is None else from_ms(ms)

    def next_due_ms(self, kinds: Sequence[str] | None = None) -> int | None:
        """Earliest scheduledAt of the kinds, leases included (they come back when they lapse)."""
        row = self.db.fetchone(self.queries["next_due"], {"kinds": self._kinds(kinds)})
        return None if row is None or row[0] is None else int(row[0])

    def status(self, *, exact: bool = False, cap: int = COUNT_CAP) -> list[KindStatus]:
        """Counters per kind of the whole table (see ``delayq status``).

        Each count reads at most ``cap`` rows; past it the count is labelled (``due_accuracy``,
        ``scheduled_accuracy``). ``exact=True`` counts every row instead (seconds at 10M rows).
        """
        if not exact:
            return capped_status(self, cap)
        rows = self.db.fetchall(self.queries["status"], {"now": self._now_ms()})
        return [KindStatus(*r) for r in rows]


def _delivery_order(row: PolledRow) -> tuple[int, int, int]:
    """Envelopes come back by priority (the kind's place in ``kinds``), then due time, then id."""
    return row.ord, row.previous_at, row.id  # type: ignore[return-value]  # messages only
