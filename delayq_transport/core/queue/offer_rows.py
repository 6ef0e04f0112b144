"""What a publish sends and what its result means, whichever connection runs it: delayq's own
(core/queue/offer.py over core/queue/executor.py) or the caller's, inside its transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..db.database import as_arrays
from ..db.rows import CreatedRow
from .announce import MAX_LISTED
from .types import OfferOutcome, StoredMessage

#: Rows per multi-row insert; bounded so one statement never carries an unbounded payload.
OFFER_BATCH_CHUNK = 1000
#: A CAS loop that keeps losing is a bug or a pathological hot key, not something to spin on.
MAX_CAS_ATTEMPTS = 100


def replacement(row: tuple[Any, ...], params: dict[str, Any]) -> dict[str, Any] | None:
    """The compare-and-swap parameters replacing the locked row ``row`` with ``params``, or
    None when the row already holds them and waits (the offer is then IGNORED)."""
    existing = StoredMessage.from_row(row)
    if (existing.payload == params["payload"]
            and existing.scheduled_at_initially_ms == params["scheduled_at"]
            and not existing.in_flight):
        return None
    return dict(params, expected_initially=existing.scheduled_at_initially_ms,
                expected_created=existing.created_at_ms)


def batch_params(chunk: list[dict[str, Any]], lead_ms: int | None) -> dict[str, Any]:
    """``offer_batch_insert``'s parameters: one array per column."""
    keys, kinds, payloads, ats = as_arrays(
        [(p["key"], p["kind"], p["payload"], p["scheduled_at"]) for p in chunk], 4)
    return {"keys": keys, "kinds": kinds, "payloads": payloads, "ats": ats,
            "now": chunk[0]["now"], "min_lead_ms": lead_ms, "max_listed": MAX_LISTED}


def chunk_outcomes(
    chunk: list[dict[str, Any]],
    rows: Sequence[CreatedRow],
    can_update: bool,
    existing: Callable[[dict[str, Any]], OfferOutcome],
    lower: Callable[[str, int], None],
) -> list[OfferOutcome]:
    """Outcomes in input order from the rows created: a key
    not created existed already (or repeats in the chunk) and goes through ``existing`` when
    ``can_update``, else it is IGNORED."""
    if rows:
        lower(rows[0].kind, min(int(r.scheduled_at) for r in rows))  # one kind per queue
    created = {row.key for row in rows}
    outcomes: list[OfferOutcome] = []
    for p in chunk:
        if p["key"] in created:
            created.discard(p["key"])  # a repeat of this key in the batch is not "created"
            outcomes.append(OfferOutcome.CREATED)
        elif can_update:
            outcomes.append(existing(p))
        else:
            outcomes.append(OfferOutcome.IGNORED)
    return outcomes
