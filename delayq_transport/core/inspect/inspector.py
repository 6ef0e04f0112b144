"""Read and manage individual rows of a queue table: what ``delayq tasks`` and ``delayq web`` use.

Every read here is bounded so it costs the same on 5M rows as on 5k: listing is a keyset
window over the (pKind, scheduledAt) index (never OFFSET), counts stop at a cap, and large
timeline buckets are estimated from the planner's histogram instead of counted. Writes never
touch a row a consumer holds (``lockUuid`` set): a task running under a worker is neither
cancelled nor moved; callers report it as in flight instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..db.errors import InvalidInput
from ..queue.counts import bounded_read
from ..queue.delayed_queue import DelayedQueue
from ..queue.types import KindOverview, TableStats
from ..queue.validate import validate_key, validate_kind

#: Bounds of a BIGINT: "no bound" for ETA ranges and the start cursor.
MIN_MS = -(2**63)
MAX_MS = 2**63 - 1
#: Kinds read by ``kinds()``; a table with more is misused (kinds are queues x priorities).
MAX_KINDS = 500
MAX_WINDOW = 50_000
MAX_BUCKETS = 200


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One row and its state at the database's ``now_ms``.

    ``state``: ``in_flight`` (a consumer holds a live lease), ``due`` (waiting and due, or a
    lapsed lease), ``scheduled`` (waiting for its time). ``redelivered``: it was delivered
    before and came back (released, or its lease lapsed).
    """

    id: int
    key: str
    kind: str
    payload: bytes | None
    scheduled_at_ms: int
    scheduled_at_initially_ms: int
    lock: str | None
    created_at_ms: int
    now_ms: int

    @classmethod
    def from_row(cls, r: Sequence[Any]) -> TaskRow:
        payload = None if r[3] is None else bytes(r[3])
        return cls(int(r[0]), r[1], r[2], payload, int(r[4]), int(r[5]), r[6], int(r[7]),
                   int(r[8]))

    @property
    def in_flight(self) -> bool:
        return self.lock is not None and self.scheduled_at_ms > self.now_ms

    @property
    def held(self) -> bool:
        """A consumer has acquired it (even if its lease lapsed): never moved or deleted."""
        return self.lock is not None

    @property
    def redelivered(self) -> bool:
        return self.scheduled_at_ms > self.scheduled_at_initially_ms and not self.in_flight

    @property
    def state(self) -> str:
        if self.in_flight:
            return "in_flight"
        return "due" if self.scheduled_at_ms <= self.now_ms else "scheduled"


def _parse_histogram(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(v) for v in text.strip("{}").split(",") if v]
    except ValueError:
        return []


class Inspector:
    """Row-level reads and writes for one queue table (any kind), over the queue's pool."""

    def __init__(self, queue: DelayedQueue) -> None:
        self.queue = queue
        self.db = queue.db
        self.q = queue.queries

    def _now(self) -> int | None:
        return self.queue.clock_ms()

    def now_ms(self) -> int:
        """The queue's clock in epoch ms (the database's unless a test injected one)."""
        row = self.db.fetchone(self.q["db_now"], {"now": self._now()})
        assert row is not None
        return int(row[0])

    def kinds(self) -> list[str]:
        rows = bounded_read(self.queue, "inspect_kinds", {"limit": MAX_KINDS})
        return [r[0] for r in rows]

    def window(
        self,
        kinds: Sequence[str],
        *,
        after: tuple[int, int] = (MIN_MS, MIN_MS),
        lo: int = MIN_MS,
        hi: int = MAX_MS,
        budget: int = 100,
        with_payload: bool = False,
    ) -> list[TaskRow]:
        """The next ``budget`` rows after the keyset cursor ``after`` = (scheduledAt, id), in
        that order, with lo <= scheduledAt < hi. Payloads only when asked (filters need them)."""
        if not 1 <= budget <= MAX_WINDOW:
            raise InvalidInput(f"window budget must be 1..{MAX_WINDOW}, got {budget}")
        kinds = [validate_kind(k) for k in kinds]
        if not kinds:
            return []
        params = {"kinds": kinds, "after_at": int(after[0]), "after_id": int(after[1]),
                  "lo": int(lo), "hi": int(hi), "budget": budget, "with_payload": with_payload,
                  "now": self._now()}
        return [TaskRow.from_row(r) for r in bounded_read(self.queue, "inspect_window", params)]

    def match_window(self, kind: str, *, after: tuple[int, int] = (MIN_MS, MIN_MS),
                     lo: int = MIN_MS, hi: int = MAX_MS, budget: int = 100
                     ) -> list[tuple[int, int, int]]:
        """(id, scheduledAt, createdAt) of the next ``budget`` rows of one kind after the
        keyset cursor, with lo <= scheduledAt < hi: what a bulk action collects."""
        if not 1 <= budget <= MAX_WINDOW:
            raise InvalidInput(f"window budget must be 1..{MAX_WINDOW}, got {budget}")
        params = {"kind": validate_kind(kind), "after_at": int(after[0]),
                  "after_id": int(after[1]), "lo": int(lo), "hi": int(hi), "budget": budget}
        return [(int(r[0]), int(r[1]), int(r[2]))
                for r in bounded_read(self.queue, "inspect_match_window", params)]

    def held(self, kinds: Sequence[str], *, after: tuple[int, int] = (MIN_MS, MIN_MS),
             budget: int = 100) -> list[TaskRow]:
        """Rows a consumer acquired (live or lapsed lease) after the cursor, in (scheduledAt, id)
        order, through the lockUuid index."""
        if not 1 <= budget <= MAX_WINDOW:
            raise InvalidInput(f"budget must be 1..{MAX_WINDOW}, got {budget}")
        params = {"kinds": [validate_kind(k) for k in kinds], "after_at": int(after[0]),
                  "after_id": int(after[1]), "budget": budget, "now": self._now()}
        return [TaskRow.from_row(r) for r in bounded_read(self.queue, "inspect_held", params)]

    # Lookups by id or key run as they are, not under the plan guard: an equality on a unique
    # index is planned right whatever the statistics, and with sorts off a lookup ordered by
    # id walked the whole primary key instead of sorting the one row found (2M rows read).

    def by_ids(self, ids: Sequence[int]) -> list[TaskRow]:
        ids = [int(i) for i in ids]
        if not ids:
            return []
        rows = self.db.fetchall(self.q["inspect_by_ids"], {"ids": ids, "now": self._now()})
        return [TaskRow.from_row(r) for r in rows]

    def by_key(self, key: str) -> list[TaskRow]:
        params = {"key": validate_key(key), "now": self._now()}
        return [TaskRow.from_row(r) for r in self.db.fetchall(self.q["inspect_by_key"], params)]

    def by_keys(self, keys: Sequence[str]) -> list[TaskRow]:
        params = {"keys": [validate_key(k) for k in keys], "now": self._now()}
        return [TaskRow.from_row(r) for r in self.db.fetchall(self.q["inspect_by_keys"], params)]

    def cancel(self, ids: Sequence[int]) -> list[int]:
        """Delete the waiting rows among ``ids``; returns the ids deleted (held rows stay)."""
        ids = [int(i) for i in ids]
        if not ids:
            return []
        return [r[0] for r in self.db.fetchall(self.q["inspect_cancel"], {"ids": ids})]

    def cancel_unchanged(self, ids: Sequence[int], ats: Sequence[int],
                         created: Sequence[int]) -> list[int]:
        """Delete the waiting rows among ``ids`` that still have the ETA (``ats``) and creation
        time they had when a filter matched them; returns the ids deleted."""
        if not ids:
            return []
        params = {"ids": [int(i) for i in ids], "ats": [int(a) for a in ats],
                  "created": [int(c) for c in created]}
        return [r[0] for r in self.db.fetchall(self.q["inspect_cancel_unchanged"], params)]

    def reschedule(self, row: TaskRow, at_ms: int, payload: bytes) -> bool:
        """Move ``row`` (as read) to ``at_ms`` with ``payload``; False if a consumer took it or
        it was replaced since it was read."""
        params = {"id": row.id, "at": int(at_ms), "payload": payload,
                  "expected_created": row.created_at_ms,
                  "expected_initially": row.scheduled_at_initially_ms}
        return bool(self.db.fetchall(self.q["inspect_reschedule"], params))

    def reschedule_many(self, moves: Sequence[tuple[TaskRow, int, bytes]]) -> list[int]:
        """Move each (row as read, new time ms, payload) in one statement; returns the ids
        moved (a row a consumer took or that was replaced since it was read stays)."""
        if not moves:
            return []
        params = {"ids": [r.id for r, _, _ in moves], "ats": [int(at) for _, at, _ in moves],
                  "payloads": [p for _, _, p in moves],
                  "created": [r.created_at_ms for r, _, _ in moves],
                  "initially": [r.scheduled_at_initially_ms for r, _, _ in moves]}
        return [r[0] for r in self.db.fetchall(self.q["inspect_reschedule_many"], params)]

    def overview(self, kinds: Sequence[str], cap: int = 10_000,
                 redelivered_cap: int = 1_000) -> list[KindOverview]:
        """Bounded counters per kind; redeliveries are counted among the ``redelivered_cap``
        soonest rows of each kind (they need the heap, the other counts only the index)."""
        kinds = [validate_kind(k) for k in kinds]
        if not kinds:
            return []
        params = {"kinds": kinds, "cap": cap, "redelivered_cap": redelivered_cap,
                  "now": self._now()}
        rows = bounded_read(self.queue, "inspect_overview", params)
        return [KindOverview(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4]),
                             None if r[5] is None else int(r[5]),
                             None if r[6] is None else int(r[6]), int(r[7]), cap)
                for r in rows]

    def timeline(
        self, kinds: Sequence[str], edges: Sequence[int], cap: int = 2_000
    ) -> list[int]:
        """Rows per bucket [edges[i], edges[i+1]), each count stopping at ``cap``."""
        if not 2 <= len(edges) <= MAX_BUCKETS + 1:
            raise InvalidInput(f"timeline needs 1..{MAX_BUCKETS} buckets")
        kinds = [validate_kind(k) for k in kinds]
        if not kinds:
            return [0] * (len(edges) - 1)
        params = {"kinds": kinds, "los": list(edges[:-1]), "his": list(edges[1:]), "cap": cap}
        return [int(r[1]) for r in bounded_read(self.queue, "inspect_timeline", params)]

    def stats(self) -> TableStats:
        row = self.db.fetchone(self.q["inspect_stats"],
                               {"table_name": self.queue.table, "now": self._now()})
        if row is None:
            return TableStats(0, [], 0, 0, 0, self.now_ms())
        return TableStats(max(int(row[0]), 0), _parse_histogram(row[1]), int(row[2]),
                          int(row[3]), int(row[4]), int(row[5]))
