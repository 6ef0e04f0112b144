"""Offering messages once across attempts of the caller: :meth:`OnceOffering.offer_once`.

A caller that moves messages in from another broker (``delayq move-from``) cannot make the
source's removal and delayq's insert one transaction: it offers, then removes, and may die in
between; its next attempt finds the message in the source again. Keys make that re-offer
harmless only while the row waits: a worker may have run and acked it meanwhile, and the
re-offer would insert it again (the task would run twice). So each offer records the source
message's own id in the run ledger (``<table>__runs``, part :data:`ONCE_PART`; see
:mod:`..ledgers.runs`) **in the transaction of its row**: the message is offered and recorded, or
neither, and an id found recorded writes nothing.

The caller forgets the ids once the source no longer holds those messages
(:meth:`~OnceOffering.forget_once`). An id it could not forget (it died after the removal)
stays behind, ~100 bytes, and is only ever consulted again for that very message.

A key already taken in the table by another message is a **conflict**: nothing is written or
recorded, and the caller keeps its message where it was (never a silent replace, nor a drop).
The very same payload found under the key is the message itself (a re-offer after the ledger
lost its entry): it is recorded, and nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg

from ..db.database import as_arrays, cursor_of
from ..db.rows import named
from .announce import MAX_LISTED
from .executor import Pooled
from .validate import (
    MAX_KEY_CHARS,
    MsMemo,
    scheduled_ms,
    validate_key,
    validate_kind,
    validate_payload,
)

if TYPE_CHECKING:
    from ..db.database import Database
    from ..db.queries import Queries
    from .announce import Announcer

#: The run-ledger part of a once-offered message's id (Spark's runs use 0.. and -1).
ONCE_PART = -2
#: Offers per transaction: bounded so one statement never carries an unbounded payload.
ONCE_CHUNK = 1000


class OnceOffer(NamedTuple):
    """One message for :meth:`OnceOffering.offer_once`: ``once_id`` names it at its source."""

    once_id: str
    key: str
    kind: str
    payload: bytes
    scheduled_at: datetime | None = None


class OnceOutcome(Enum):
    #: Inserted, and its id recorded.
    CREATED = "created"
    #: Its id was recorded before (or earlier in the same call): nothing written.
    RECORDED = "recorded"
    #: Its key already held this very payload: recorded, nothing written.
    IDENTICAL = "identical"
    #: Its key holds another message: nothing written, nothing recorded.
    CONFLICT = "conflict"

    @property
    def stored(self) -> bool:
        """The message is in the table (the caller may remove it from its source)."""
        return self is not OnceOutcome.CONFLICT


class OnceOffering:
    """The once-only half of publishing; a base of :class:`~.delayed_queue.DelayedQueue`."""

    db: Database
    queries: Queries
    announcer: Announcer

    if TYPE_CHECKING:  # provided by DelayedQueue and Offering

        def _now_ms(self) -> int | None: ...

        def _lower(self, kind: str, at_ms: int) -> None: ...


    def offer_once(self, items: Iterable[OnceOffer], *, durable: bool = True
                   ) -> list[OnceOutcome]:
        """Offer each message unless its ``once_id`` was recorded; record it with its row.

        Every item is validated before anything is sent. Outcomes come back in input order.
        Kinds may differ between items (the queue's own kind is not used).
        """
        memo: MsMemo = {}
        prepared = [self._once_params(item, memo) for item in items]
        outcomes: list[OnceOutcome] = []
        for start in range(0, len(prepared), ONCE_CHUNK):
            chunk = prepared[start : start + ONCE_CHUNK]
            outcomes += self.db.run(partial(self._once_chunk, chunk=chunk), relaxed=not durable)
        return outcomes

    def forget_once(self, once_ids: Iterable[str]) -> int:
        """Drop recorded ids (their messages left their source for good); returns how many."""
        ids = list(dict.fromkeys(once_ids))
        if not ids:
            return 0
        return self.db.execute(self.queries["once_forget"], {"ids": ids, "part": ONCE_PART})

    def _once_params(self, item: OnceOffer, memo: MsMemo) -> dict[str, Any]:
        if not isinstance(item, OnceOffer):
            raise TypeError(f"offer_once takes OnceOffer items, got {type(item).__name__}")
        return {
            "id": validate_key(item.once_id, what="once_id", limit=MAX_KEY_CHARS),
            "key": validate_key(item.key),
            "kind": validate_kind(item.kind),
            "payload": validate_payload(item.payload),
            "at": scheduled_ms(item.scheduled_at, memo),
        }

    def _once_chunk(self, conn: psycopg.Connection[Any], chunk: list[dict[str, Any]]
                    ) -> list[OnceOutcome]:
        """One transaction: claim the ids, insert the claimed rows, sort out the keys taken.

        Rerun whole by ``db.run`` after a transient error: a commit that did happen shows up
        as RECORDED then, which the caller treats like CREATED. The insert carries the
        process' wake-up when the announcer's window is over (core/queue/announce.py), delivered by
        this transaction's commit; else the created rows are noted there after the commit."""
        first: dict[str, int] = {}  # once_id -> its first item; later ones: the same message
        for i, p in enumerate(chunk):
            first.setdefault(p["id"], i)
        leaders = [chunk[i] for i in first.values()]
        claimed, created, identical = Pooled(conn, self.queries, self.announcer).announced(
            lambda wakeup: self._once_transaction(conn, leaders, wakeup),
            lambda result: list(result[1].values()))
        for kind, at in created.values():
            self._lower(kind, at)
        by_id = {p["id"]: (OnceOutcome.CREATED if p["id"] in created
                           else OnceOutcome.IDENTICAL if p["id"] in identical
                           else OnceOutcome.CONFLICT if p["id"] in claimed
                           else OnceOutcome.RECORDED) for p in leaders}
        return [by_id[p["id"]] if first[p["id"]] == i or by_id[p["id"]] is OnceOutcome.CONFLICT
                else OnceOutcome.RECORDED for i, p in enumerate(chunk)]

    def _once_transaction(self, conn: psycopg.Connection[Any], leaders: list[dict[str, Any]],
                          wakeup: dict[str, Any]
                          ) -> tuple[set[str], dict[str, tuple[str, int]], set[str]]:
        """(ids claimed, once_id -> (kind, scheduledAt) of the rows created, ids whose key
        held their very payload), committed together."""
        now = self._now_ms()
        cur = cursor_of(conn)
        with conn.transaction():
            claimed = {r[0] for r in cur.execute(self.queries["once_claim"], {
                "ids": [p["id"] for p in leaders], "part": ONCE_PART, "now": now}).fetchall()}
            fresh = [p for p in leaders if p["id"] in claimed]
            created = self._once_insert(cur, fresh, now, wakeup)
            taken = [p for p in fresh if p["id"] not in created]
            identical = self._once_identical(cur, taken)
            conflicts = [p["id"] for p in taken if p["id"] not in identical]
            if conflicts:
                cur.execute(self.queries["once_forget"], {"ids": conflicts, "part": ONCE_PART})
        return claimed, created, identical

    def _once_insert(self, cur: psycopg.Cursor[Any], fresh: list[dict[str, Any]],
                     now: int | None, wakeup: dict[str, Any]
                     ) -> dict[str, tuple[str, int]]:
        """Insert the first offer of each key and kind; once_id -> (kind, scheduledAt) of each
        row created (a later offer of the same key then meets it as taken)."""
        firsts: dict[tuple[str, str], dict[str, Any]] = {}
        for p in fresh:
            firsts.setdefault((p["key"], p["kind"]), p)
        if not firsts:
            return {}
        ordered = [firsts[k] for k in sorted(firsts)]  # same lock order in every caller
        keys, kinds, payloads, ats = as_arrays(
            [(p["key"], p["kind"], p["payload"], p["at"]) for p in ordered], 4)
        rows = named("offer_batch_insert", cur.execute(self.queries["offer_batch_insert"], {
            "keys": keys, "kinds": kinds, "payloads": payloads, "ats": ats, "now": now,
            "min_lead_ms": None, "max_listed": MAX_LISTED, **wakeup}).fetchall())
        return {firsts[(r.key, r.kind)]["id"]: (r.kind, int(r.scheduled_at)) for r in rows}

    def _once_identical(self, cur: psycopg.Cursor[Any], taken: Sequence[dict[str, Any]]
                        ) -> set[str]:
        """The once_ids among ``taken`` whose key holds their very payload."""
        if not taken:
            return set()
        ids, keys, kinds, payloads = as_arrays(
            [(p["id"], p["key"], p["kind"], p["payload"]) for p in taken], 4)
        rows = cur.execute(self.queries["once_identical"], {
            "ids": ids, "keys": keys, "kinds": kinds, "payloads": payloads}).fetchall()
        return {r[0] for r in rows}
