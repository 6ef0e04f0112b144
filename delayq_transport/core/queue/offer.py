"""Publishing: ``offer`` and ``offer_batch`` of :class:`~.delayed_queue.DelayedQueue`.

A row is inserted optimistically (``offer_insert``; 0 rows means the key exists, then a
compare-and-swap replaces it when asked to). Concurrent offers of one process share one insert
and commit (core/queue/combine.py), and created rows are announced to the consumers by a NOTIFY
carried in a publish's own insert, delivered at its commit, at most once per kind per window
(core/queue/announce.py).

Inside :func:`~.joined.transaction` (or a framework's transaction the Django app names), an
offer is written in the caller's transaction instead. Both run the same code below over an
:class:`~.executor.Executor`: delayq's pooled connection or the caller's (core/queue/executor.py
says what differs); :func:`~.joined.current` picks which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg

from ..db.errors import DatabaseError
from ..db.rows import CreatedRow
from .combine import ALONE, OfferCombiner
from .executor import Executor, InCaller, Pooled
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
    from ..db.database import Database
    from ..db.queries import Queries
    from .announce import Announcer


class Offering:
    """The publishing half of :class:`~.delayed_queue.DelayedQueue` (which sets these
    attributes)."""

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

    def _make_combiners(self) -> dict[bool, OfferCombiner]:
        """Concurrent offers share one insert and commit, per durability (core/queue/combine.py)."""
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
        if (joined := current()) is not None:  # the caller's transaction (core/queue/joined.py)
            return self._offer_on(InCaller(joined, self.queries, self.db), params, can_update,
                                  lead_ms)
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
        return self._offer_pooled(params, can_update, lead_ms, durable)

    def _offer_pooled(self, params: dict[str, Any], can_update: bool, lead_ms: int | None,
                      durable: bool = True) -> OfferOutcome:
        def work(conn: psycopg.Connection[Any]) -> OfferOutcome:
            return self._offer_on(self._pooled(conn), params, can_update, lead_ms)

        return self.db.run(work, relaxed=not durable)

    def _pooled(self, conn: psycopg.Connection[Any]) -> Pooled:
        return Pooled(conn, self.queries, self.announcer)

    def _insert_one(self, durable: bool) -> Callable[[dict[str, Any]], int | None]:
        """The combiner's write of a lone offer: ``offer_insert`` on libpq (core/db/direct.py)."""

        def work(conn: psycopg.Connection[Any], params: dict[str, Any]) -> int | None:
            return self._pooled(conn).insert_one(params)

        return lambda params: self.db.run(partial(work, params=params), relaxed=not durable)

    def _insert_many(self, durable: bool) -> Callable[[list[dict[str, Any]]], list[CreatedRow]]:
        """The combiner's write of offers that gathered: one ``offer_batch_insert``."""
        return lambda chunk: self._insert_rows(chunk, None, durable)

    def _insert_rows(self, chunk: list[dict[str, Any]], lead_ms: int | None, durable: bool
                     ) -> list[CreatedRow]:
        """One multi-row insert, committed and announced: the rows created."""
        params = batch_params(chunk, lead_ms)

        def work(conn: psycopg.Connection[Any]) -> list[CreatedRow]:
            return self._pooled(conn).insert_batch(params)

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

    def _offer_on(self, ex: Executor, params: dict[str, Any], can_update: bool,
                  lead_ms: int | None) -> OfferOutcome:
        """The one offer of one validated row, whichever connection ``ex`` runs it on: insert,
        or find the row (locked) and replace it by compare-and-swap, until one of them wins."""
        for _ in range(MAX_CAS_ATTEMPTS):
            too_close = lead_ms is not None and _too_close(ex, params, lead_ms)
            if not too_close and (at := ex.insert_one(params)) is not None:
                self._lower(params["kind"], at)
                return OfferOutcome.CREATED
            if not can_update:
                return OfferOutcome.IGNORED
            with ex.locked():
                found = ex.run("offer_select_for_update", params)
                if not found:
                    if too_close:
                        return OfferOutcome.IGNORED
                    continue  # consumed meanwhile: insert again
                cas = replacement(found[0], params)
                if cas is None:
                    return OfferOutcome.IGNORED
                # The update trigger sends this row's wake-up (in the caller's transaction:
                # at its commit).
                if updated := ex.run("offer_cas_update", cas):
                    self._lower(params["kind"], int(updated[0][0]))
                    return OfferOutcome.UPDATED
        raise DatabaseError(f"offer({params['key']!r}) lost {MAX_CAS_ATTEMPTS} compare-and-swaps")

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
        if (joined := current()) is not None:  # the caller's transaction (core/queue/joined.py)
            ex = InCaller(joined, self.queries, self.db)
            return self._offer_chunks(
                prepared, chunk_size, can_update,
                lambda chunk: ex.insert_batch(batch_params(chunk, lead_ms)),
                lambda p: self._offer_on(ex, p, True, lead_ms))
        # On delayq's pool each chunk commits on its own, and each replace (durably).
        return self._offer_chunks(
            prepared, chunk_size, can_update,
            partial(self._insert_rows, lead_ms=lead_ms, durable=durable),
            partial(self._offer_pooled, can_update=True, lead_ms=lead_ms))

    def _offer_chunks(
        self, prepared: list[dict[str, Any]], chunk_size: int, can_update: bool,
        insert: Callable[[list[dict[str, Any]]], list[CreatedRow]],
        existing: Callable[[dict[str, Any]], OfferOutcome],
    ) -> list[OfferOutcome]:
        """``insert`` each chunk, then the outcomes in input order, ``existing`` offering a
        key that was not created (when ``can_update``)."""
        outcomes: list[OfferOutcome] = []
        for start in range(0, len(prepared), chunk_size):
            chunk = prepared[start : start + chunk_size]
            outcomes += chunk_outcomes(chunk, insert(chunk), can_update, existing, self._lower)
        return outcomes


def _too_close(ex: Executor, params: dict[str, Any], lead_ms: int) -> bool:
    """Whether the row would be due before now + ``lead_ms`` (by the queue's clock)."""
    now = ex.run("db_now", params)[0][0]
    at = params["scheduled_at"]
    return at is None or at <= now + lead_ms
