"""Low watermarks: where a consumer's poll may start scanning, per kind.

Every acquire moves a row's ``scheduledAt`` (an indexed column, so no HOT update) and every ack
deletes it: each leaves a dead entry at the low end of the ``(pKind, scheduledAt)`` index, exactly
where a poll starts. Vacuum removes them unless some snapshot is older (``pg_dump``, a report, an
idle-in-transaction session): then each poll walks all of them and the queue slows down in
proportion to the work done since the snapshot was taken (docs/scale.md has the measurements).

A consumer that just polled knows more than the index does: below a certain time there is no
live due row it could take. The watermark remembers that time per kind and the poll scans
``low <= scheduledAt <= now`` instead of from the bottom. After a poll:

* a kind whose scan ran out of due rows (fewer taken than asked, or a later kind was reached):
  nothing due was left up to the statement's ``now``, so ``low = now``;
* the kind that filled the batch: everything in ``[low, max taken]`` was taken or locked by
  someone else, so ``low = max(scheduledAt taken)`` (ties stay in range, the bound is ``>=``);
* a kind the scan never reached keeps its watermark.

A live due row can appear below the watermark only through a write the poll could not see or a
lock it skipped; each path has its answer (tests/integration/test_watermark.py covers each):

* another session's insert, CAS update or release that committed after the poll's snapshot but
  whose ``scheduledAt`` is earlier (its transaction started earlier, or an ETA in the past): the
  insert/update triggers NOTIFY ``kind:ms`` and the listener calls :meth:`lower`;
* this process's own offers and releases lower the watermark from their ``RETURNING`` row;
* a row skipped because another transaction held its lock and then rolled back (a failed
  concurrent poll, a failed ack of an expired lease): no notification, so a **full rescan** from
  the bottom runs at least every ``full_rescan_interval_s`` per kind;
* a lowering that arrives while a poll is running is kept: the poll's result cannot raise the
  watermark above it (the poll's snapshot may not have seen that row);
* a lost LISTEN connection (notifications missed): the listener calls :meth:`reset`;
* the database clock stepped back below the watermark: the statement ignores a watermark above
  its ``now`` and scans from the bottom.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: Default seconds between full rescans (from the bottom of the index) of one kind.
DEFAULT_FULL_RESCAN_INTERVAL_S = 30.0


@dataclass(eq=False)
class PollTicket:
    """One running poll: the kinds and floors it scans, and lowerings seen while it ran.
    Compared by identity: two polls with the same floors are still two polls."""

    kinds: list[str]
    lows: list[int | None]
    want_next: bool = True
    lowered: dict[str, int] = field(default_factory=dict)


class LowWatermarks:
    """Per-kind scan floors of one consumer process; thread-safe (polls may overlap)."""

    def __init__(
        self,
        full_rescan_interval_s: float = DEFAULT_FULL_RESCAN_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.full_rescan_interval_s = full_rescan_interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._low: dict[str, int] = {}
        self._rescanned_at: dict[str, float] = {}
        self._running: list[PollTicket] = []
        #: Earliest due time known per polled kind set (None: nothing left), see next_due().
        self._next: dict[tuple[str, ...], int | None] = {}
        #: Latest statement time seen: announcements at or before it are due, not "next".
        self._polled_at = -(2**63)

    def begin(self, kinds: Sequence[str]) -> PollTicket:
        """Floors for a poll of ``kinds`` (None: scan from the bottom, a rescan is due)."""
        now = self._monotonic()
        with self._lock:
            lows: list[int | None] = []
            for kind in kinds:
                last = self._rescanned_at.get(kind)
                stale = last is None or now - last >= self.full_rescan_interval_s
                lows.append(None if stale else self._low.get(kind))
            want = None in lows or tuple(kinds) not in self._next
            ticket = PollTicket(list(kinds), lows, want_next=want)
            self._running.append(ticket)
            return ticket

    def finish(
        self, ticket: PollTicket, taken_max: dict[str, int], limit: int, taken: int,
        polled_at: int | None, next_due: int | None = None,
    ) -> int | None:
        """Record what a poll proved (see the module docstring); ``taken_max`` maps each kind
        that gave rows to the largest ``scheduledAt`` taken from it, ``next_due`` is what the
        statement found when ``ticket.want_next``. Returns the next due time to report."""
        now = self._monotonic()
        with self._lock:
            self._drop(ticket)
            if polled_at is None:
                return next_due
            nxt = self._remember_next(ticket, polled_at, next_due)
            full = taken >= limit
            reached = max((i for i, k in enumerate(ticket.kinds) if k in taken_max), default=-1)
            for i, kind in enumerate(ticket.kinds):
                if full and i > reached:
                    continue  # never scanned: nothing learnt
                low = taken_max[kind] if full and i == reached else polled_at
                low = min(low, ticket.lowered.get(kind, low))
                self._low[kind] = low
                if ticket.lows[i] is None:
                    self._rescanned_at[kind] = now
            return nxt

    def _remember_next(self, ticket: PollTicket, polled_at: int, found: int | None
                       ) -> int | None:
        """The next due time of a poll that did not search for it: the last one found, lowered
        by every announcement since. Searching walks all leases of the last acquire_timeout
        (acked ones too, under a held snapshot), so it runs only on a full rescan or once the
        remembered time has passed. Leases taken by others since are not in it: an expired
        one is found by the next poll (at once under load, within the fallback interval of
        an idle consumer)."""
        key = tuple(ticket.kinds)
        self._polled_at = max(self._polled_at, polled_at)
        known = [at for k, at in ticket.lowered.items() if k in key and at > polled_at]
        if ticket.want_next:
            value = min([*known, *([] if found is None else [found])], default=None)
        else:
            value = self._next.get(key)
            if known:
                value = min([*known, *([] if value is None else [value])])
        if value is not None and value <= polled_at:
            self._next.pop(key, None)  # passed: the next poll searches again
        else:
            self._next[key] = value
        return value

    def abort(self, ticket: PollTicket) -> None:
        """A poll that failed proves nothing; keep what it saw lowered."""
        with self._lock:
            self._drop(ticket)

    def _drop(self, ticket: PollTicket) -> None:
        if ticket in self._running:
            self._running.remove(ticket)
        for kind, at in ticket.lowered.items():
            if kind in self._low and at < self._low[kind]:
                self._low[kind] = at

    def lower(self, kind: str, at_ms: int) -> None:
        """A row of ``kind`` is (or will be) due at ``at_ms``: never scan above it, and report
        it as the next due time if it is the earliest known."""
        with self._lock:
            if kind in self._low and at_ms < self._low[kind]:
                self._low[kind] = at_ms
            if at_ms > self._polled_at:  # a due-now row wakes the consumer anyway
                for key, at in self._next.items():
                    if kind in key and (at is None or at_ms < at):
                        self._next[key] = at_ms
            for ticket in self._running:
                if kind in ticket.kinds and at_ms < ticket.lowered.get(kind, at_ms + 1):
                    ticket.lowered[kind] = at_ms

    def reset(self) -> None:
        """Forget every floor: the next poll of each kind scans from the bottom."""
        with self._lock:
            self._low.clear()
            self._rescanned_at.clear()
            self._next.clear()
            for ticket in self._running:
                ticket.lowered.update({k: -(2**63) for k in ticket.kinds})

    def low(self, kind: str) -> int | None:
        """The current floor of ``kind`` (None: none known), for tests and diagnostics."""
        with self._lock:
            return self._low.get(kind)
