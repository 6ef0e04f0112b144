"""``offer`` and ``offer_batch`` written in the caller's transaction (core/joined.py).

The statements and their meaning are delayq's own publish's (core/offer.py, through
core/offer_rows.py); what differs is around them. No combiner, buffer or announcer: they
would commit or notify on delayq's connections. The insert carries its own wake-up
(``announce``: a NOTIFY of the rows it created), so a publish costs one statement and no
commit; the NOTIFY is delivered at the caller's commit, and dropped with it or its
savepoint. A key that exists already is replaced by the same compare-and-swap, inside the
caller's transaction (its row lock then lasts until that transaction ends; consumers skip
locked rows). ``durable`` does not apply: the caller's
commit decides when the row is on disk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .errors import DatabaseError
from .offer_rows import MAX_CAS_ATTEMPTS, batch_params, chunk_outcomes, replacement
from .types import OfferOutcome

if TYPE_CHECKING:
    from .db import Database
    from .joined import Joined
    from .queries import Queries


class Offering(Protocol):
    """What a joined offer needs of its queue (core/offer.py's ``Offering`` is one), as a
    Protocol so this module does not import the one that calls it."""

    db: Database
    queries: Queries

    def lower_watermark(self, kind: str, at_ms: int) -> None:
        """A row of ``kind`` due at ``at_ms`` was written by this process."""


#: The insert notifies the rows it creates, in the caller's transaction (nothing pending: this
#: process' announcer never carries over into a transaction that is not delayq's).
_ANNOUNCE: dict[str, Any] = {"announce": True, "pending": []}


def offer(queue: Offering, joined: Joined, params: dict[str, Any], can_update: bool,
          lead_ms: int | None) -> OfferOutcome:
    """One validated offer (``params`` of ``Offering._offer_params``) in ``joined``."""
    joined.check_database(queue.db)
    q = queue.queries
    for _ in range(MAX_CAS_ATTEMPTS):
        too_close = lead_ms is not None and _too_close(queue, joined, params, lead_ms)
        if not too_close:
            rows = joined.run(q.portable("offer_insert"), dict(params, **_ANNOUNCE))
            if rows:
                queue.lower_watermark(params["kind"], int(rows[0][0]))
                return OfferOutcome.CREATED
        if not can_update:
            return OfferOutcome.IGNORED
        found = joined.run(q.portable("offer_select_for_update"), params)
        if not found:
            if too_close:
                return OfferOutcome.IGNORED
            continue  # consumed meanwhile: insert again
        cas = replacement(found[0], params)
        if cas is None:
            return OfferOutcome.IGNORED
        # The update trigger sends this row's wake-up in the caller's transaction.
        updated = joined.run(q.portable("offer_cas_update"), cas)
        if updated:
            queue.lower_watermark(params["kind"], int(updated[0][0]))
            return OfferOutcome.UPDATED
    raise DatabaseError(f"offer({params['key']!r}) lost {MAX_CAS_ATTEMPTS} compare-and-swaps")


def offer_batch(queue: Offering, joined: Joined, prepared: list[dict[str, Any]],
                can_update: bool, lead_ms: int | None, chunk_size: int) -> list[OfferOutcome]:
    """Validated offers, one multi-row insert (and its wake-up) per chunk, in ``joined``."""
    joined.check_database(queue.db)
    statement = queue.queries.portable("offer_batch_insert")
    outcomes: list[OfferOutcome] = []
    for start in range(0, len(prepared), chunk_size):
        chunk = prepared[start : start + chunk_size]
        rows = joined.run(statement, {**batch_params(chunk, lead_ms), **_ANNOUNCE})
        outcomes += chunk_outcomes(
            chunk, rows, can_update, lambda p: offer(queue, joined, p, True, lead_ms),
            queue.lower_watermark)
    return outcomes


def _too_close(queue: Offering, joined: Joined, params: dict[str, Any],
               lead_ms: int) -> bool:
    now = joined.run(queue.queries.portable("db_now"), params)[0][0]
    at = params["scheduled_at"]
    return at is None or at <= now + lead_ms
