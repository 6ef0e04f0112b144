"""Publishing: ``offer`` and ``offer_batch`` of :class:`~.queue.DelayedQueue`.

A row is inserted optimistically (``offer_insert``; 0 rows means the key exists, then a
compare-and-swap replaces it when asked to). Concurrent offers of one process share one insert
and commit (core/combine.py), and created rows are announced to the consumers by a NOTIFY
carried in a publish's own insert, delivered at its commit, at most once per kind per window
(core/announce.py).

Inside :func:`~.joined.transaction` (or a framework's transaction the Django app names), an
offer is written in the caller's transaction instead (core/joined_offer.py): the only change to
this path is asking :func:`~.joined.current`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from . import joined_offer
from .announce import payloads
from .combine import ALONE, OfferCombiner
from .db import cursor_of
from .errors import DatabaseError
from .joined import current
from .offer_rows import (
    MAX_CAS_ATTEMPTS,
    OFFER_BATCH_CHUNK,
    batch_params,
    chunk_outcomes,
    replacement,
)
from .timeutil import duration_ms
from .types import Offer, OfferOutcome
from .validate import MsMemo, scheduled_ms, validate_key, validate_payload

if TYPE_CHECKING:
    from .announce import Announcer
    from .db import Database
    from .queries import Queries



class Offering:
    """The publishing half of :class:`~.queue.DelayedQueue` (which sets these attributes)."""

    db: Database
    queries: Queries
    kind: str
    clock: Callable[[], datetime] | None
    announcer: Announcer
    _combiners: dict[bool, OfferCombiner]

    def _now_ms(self) -> int | None:
        raise NotImplementedError

    def _lower(self, kind: str, at_ms: int) -> None:
        raise NotImplementedError

    def lower_watermark(self, kind: str, at_ms: int) -> None:
        raise NotImplementedError

    def _make_combiners(self) -> dict[bool, OfferCombiner]:
        """Concurrent offers share one insert and commit, per durability (core/combine.py)."""
        return {durable: OfferCombiner(self._insert_one(durable), self._insert_many(durable))
                for durable in (True, False)}

    def offer(
        self,
        key: str,
        payload: bytes,
        scheduled_at: datetime | None = None,
        can_update: bool = True,
        *,
        min_lead: timedelta | None = None,
        durable: bool = True,
    ) -> OfferOutcome:
        """Insert, or (``can_update``) replace the row with this key by compare-and-swap.

        ``min_lead`` refuses to (re)create rows due sooner than now + min_lead: a late cron
        installer must not revive a tick that already fired and was acked. ``durable=False``
        returns before the commit is flushed to disk (a server crash may lose the last ~0.6 s
        of such offers, like Redis' default persistence).
        """
        params = self._offer_params(key, payload, scheduled_at)
        lead_ms = None if min_lead is None else duration_ms(min_lead, what="min_lead")
        if (joined := current()) is not None:  # the caller's transaction (core/joined.py)
            return joined_offer.offer(self, joined, params, can_update, lead_ms)
        if lead_ms is None and self.clock is None:  # concurrent offers share a commit
            at = self._combiners[durable].offer(params)
            if at is not ALONE:
                if at is not None:
                    self._lower(params["kind"], at)  # type: ignore[arg-type]
                    return OfferOutcome.CREATED
                if not can_update:
                    return OfferOutcome.IGNORED
                # the key exists: the replace path below (its insert finds it again, or
                # creates the row if it was consumed meanwhile)

        def work(conn: psycopg.Connection[Any]) -> OfferOutcome:
            return self._offer_on(conn, params, can_update, lead_ms)

        return self.db.run(work, relaxed=not durable)

    def _insert_one(self, durable: bool) -> Callable[[dict[str, Any]], int | None]:
        """The combiner's write of a lone offer: ``offer_insert`` on libpq (core/direct.py)."""

        def work(conn: psycopg.Connection[Any], params: dict[str, Any]) -> int | None:
            return self._insert_on(conn, params)

        return lambda params: self.db.run(partial(work, params=params), relaxed=not durable)

    def _insert_on(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int | None:
        """``offer_insert`` committed on ``conn``: the row's ``scheduledAt``, or None when its
        key exists. The publish that opens the announcer's window carries the wake-up in its
        own statement (core/announce.py); the others leave theirs pending there."""
        carried = self.announcer.take()
        try:
            at = self.queries.direct("offer_insert").first(
                conn, {**params, "announce": carried is not None,
                       "pending": payloads(carried)})
            _commit(conn)
        except BaseException:
            if carried:
                self.announcer.restore(carried)
            raise
        if at is None:
            if carried:
                self.announcer.restore(carried)  # nothing inserted: nothing notified either
            return None
        if carried is None:
            self.announcer.note(((params["kind"], int(at)),))
        return int(at)

    def _insert_many(self, durable: bool
                     ) -> Callable[[list[dict[str, Any]]], list[tuple[Any, ...]]]:
        """The combiner's write of offers that gathered: one ``offer_batch_insert``."""
        return lambda chunk: self._insert_rows(chunk, None, durable)

    def _insert_rows(self, chunk: list[dict[str, Any]], lead_ms: int | None, durable: bool
                     ) -> list[tuple[Any, ...]]:
        """One multi-row insert; the created rows' ``(pKey, pKind, scheduledAt)``, announced."""
        params = batch_params(chunk, lead_ms)
        statement = self.queries["offer_batch_insert"]

        def work(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            carried = self.announcer.take()  # as in _insert_on
            try:
                rows = cursor_of(conn).execute(statement, {
                    **params, "announce": carried is not None,
                    "pending": payloads(carried)}).fetchall()
                _commit(conn)
            except BaseException:
                if carried:
                    self.announcer.restore(carried)
                raise
            if carried is None:
                self.announcer.note((r[1], r[2]) for r in rows)
            elif carried and not rows:
                self.announcer.restore(carried)
            return rows

        return self.db.run(work, relaxed=not durable)

    def _offer_params(
        self, key: str, payload: bytes, at: datetime | None, *, memo: MsMemo | None = None
    ) -> dict[str, Any]:
        return {
            "key": validate_key(key),
            "kind": self.kind,
            "payload": validate_payload(payload),
            "scheduled_at": scheduled_ms(at, memo),
            "now": self._now_ms(),
        }

    def _offer_on(
        self,
        conn: psycopg.Connection[Any],
        params: dict[str, Any],
        can_update: bool,
        lead_ms: int | None,
    ) -> OfferOutcome:
        q = self.queries
        for _ in range(MAX_CAS_ATTEMPTS):
            too_close = lead_ms is not None and self._too_close(conn, params, lead_ms)
            if not too_close and (at := self._insert_on(conn, params)) is not None:
                self._lower(params["kind"], at)
                return OfferOutcome.CREATED
            if not can_update:
                return OfferOutcome.IGNORED
            cur = cursor_of(conn)  # the rare replace path only: a publish needs no cursor
            with conn.transaction():
                row = cur.execute(q["offer_select_for_update"], params).fetchone()
                if row is None:
                    if too_close:
                        return OfferOutcome.IGNORED
                    continue  # consumed meanwhile: insert again
                cas = replacement(row, params)
                if cas is None:
                    return OfferOutcome.IGNORED
                if row := cur.execute(q["offer_cas_update"], cas).fetchone():
                    self._lower(params["kind"], row[0])
                    return OfferOutcome.UPDATED
        raise DatabaseError(f"offer({params['key']!r}) lost {MAX_CAS_ATTEMPTS} compare-and-swaps")

    def _too_close(
        self, conn: psycopg.Connection[Any], params: dict[str, Any], lead_ms: int
    ) -> bool:
        now = conn.execute(self.queries["db_now"], params).fetchone()
        assert now is not None
        at = params["scheduled_at"]
        return at is None or at <= now[0] + lead_ms

    def offer_batch(
        self,
        items: Iterable[Offer | tuple[str, bytes, datetime | None]],
        can_update: bool = True,
        *,
        min_lead: timedelta | None = None,
        chunk_size: int = OFFER_BATCH_CHUNK,
        durable: bool = True,
    ) -> list[OfferOutcome]:
        """Offer many messages: one multi-row insert per chunk, one-by-one ``offer`` for the rest.

        Every item is validated before anything is sent, so bad input stores nothing. Outcomes
        come back in input order. Keys that already exist (or repeat in the batch) go through
        ``offer`` when ``can_update``, else they are IGNORED. ``durable=False`` as in ``offer``.
        """
        memo: MsMemo = {}
        prepared = [self._offer_params(*item, memo=memo) for item in items]
        lead_ms = None if min_lead is None else duration_ms(min_lead, what="min_lead")
        if (joined := current()) is not None:  # the caller's transaction (core/joined.py)
            return joined_offer.offer_batch(self, joined, prepared, can_update, lead_ms,
                                            chunk_size)
        outcomes: list[OfferOutcome] = []
        for start in range(0, len(prepared), chunk_size):
            chunk = prepared[start : start + chunk_size]
            outcomes += self._offer_chunk(chunk, can_update, lead_ms, durable)
        return outcomes

    def _offer_chunk(
        self, chunk: list[dict[str, Any]], can_update: bool, lead_ms: int | None,
        durable: bool = True,
    ) -> list[OfferOutcome]:
        rows = self._insert_rows(chunk, lead_ms, durable)
        return chunk_outcomes(chunk, rows, can_update,
                              lambda p: self._offer_existing(p, lead_ms), self._lower)

    def _offer_existing(self, params: dict[str, Any], lead_ms: int | None) -> OfferOutcome:
        """The one-by-one fallback of offer_batch for keys that already had a row."""

        def work(conn: psycopg.Connection[Any]) -> OfferOutcome:
            return self._offer_on(conn, params, True, lead_ms)

        return self.db.run(work)


def _commit(conn: psycopg.Connection[Any]) -> None:
    """Commit what ``conn`` holds open (behind a transaction pooler every statement runs in a
    transaction that :class:`~.db.Database` opened), so a failed commit is the caller's to see."""
    if conn.pgconn.transaction_status != TransactionStatus.IDLE:
        conn.commit()
