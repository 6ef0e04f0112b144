"""Low watermarks: where a consumer's poll may start scanning, per kind.

Every acquire moves a row's ``scheduledAt`` (an indexed column, so no HOT update) and every ack
deletes it: each leaves a dead entry at the low end of the ``(pKind, scheduledAt)`` index, exactly
where a poll starts. Vacuum removes them unless some snapshot is older (``pg_dump``, a report, an
idle-in-transaction session): then each poll walks all of them and the queue slows down in
proportion to the work done since the snapshot was taken (docs/explanation/scaling.md;
measured in docs/benchmarks.md).

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
  concurrent poll, a failed ack of an expired lease): no notification, so a **probe** looks for
  a due row below the floor at least every ``full_rescan_interval_s`` per kind and lowers the
  floor to it. It starts at the lowest floor held since the previous probe (every
  ``FULL_PROBE_EVERY``-th probe at the bottom of the index), still walking every dead entry a
  held snapshot keeps in that range, so it runs in a thread of its own, never in the poll:
  the polls go on from the floor meanwhile (a row the probe finds was already waiting; it
  only comes one probe later). Only a kind with no floor yet (the first
  poll, after a reset) is polled from the bottom;
* a lowering that arrives while a poll is running is kept: the poll's result cannot raise the
  watermark above it (the poll's snapshot may not have seen that row);
* a lost LISTEN connection (notifications missed): the listener calls :meth:`reset`;
* the database clock stepped back below the watermark: the statement ignores a watermark above
  its ``now`` and scans from the bottom.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Default seconds between probes below the floor (from the bottom of the index) of one kind.
DEFAULT_FULL_RESCAN_INTERVAL_S = 30.0
#: Most seconds between next-due searches asked for by announced rows coming due (see
#: ``_remember_next``): how long another consumer's new lease can stay unknown here. A poll
#: that searches is one a task may wait behind (~3 ms under a held snapshot), so they stay
#: rare enough to keep out of the pick-up p99 at a steady load.
NEXT_SEARCH_INTERVAL_S = 5.0


def next_search_interval(lease_ms: int) -> float:
    """The search interval for a lease: a quarter of it at most, so another consumer's lease is
    known here long before it can expire (a killed worker's task is taken when it does)."""
    return min(NEXT_SEARCH_INTERVAL_S, lease_ms / 4000)


#: Announced times kept per polled kind set (20,000 countdowns of a burst fit; ~4 MB at most);
#: beyond it a time is not kept but becomes a search marker (see ``lower``): nothing is lost,
#: the consumer searches from there instead.
MAX_ANNOUNCED = 100_000

#: Every this many probes of a kind, the probe starts from the bottom of the index, whatever
#: the floors since the last one (see ``_run_probe``).
FULL_PROBE_EVERY = 10

#: Runs the probe: (kinds, starts, floors) -> (kind, scheduledAt) of the earliest due row in
#: [start, floor) per kind (start None: the bottom), for the kinds that have one
#: (``DelayedQueue._probe_below``).
Probe = Callable[[list[str], list[int | None], list[int]], list[tuple[str, int]]]


@dataclass(eq=False)
class PollTicket:
    """One running poll: the kinds and floors it scans, and lowerings seen while it ran.
    Compared by identity: two polls with the same floors are still two polls."""

    kinds: list[str]
    lows: list[int | None]
    want_next: bool = True
    lowered: dict[str, int] = field(default_factory=dict)
    #: Monotonic time the poll began (a search's age counts from it).
    began: float = 0.0
    #: Kinds whose probe is due: launched once the poll is over (not competing with it).
    probe: list[str] = field(default_factory=list)


class LowWatermarks:
    """Per-kind scan floors of one consumer process; thread-safe (polls may overlap)."""

    def __init__(
        self,
        probe: Probe,
        full_rescan_interval_s: float = DEFAULT_FULL_RESCAN_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
        next_search_interval_s: float = NEXT_SEARCH_INTERVAL_S,
    ) -> None:
        self.probe = probe
        self.full_rescan_interval_s = full_rescan_interval_s
        self.next_search_interval_s = next_search_interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._low: dict[str, int] = {}
        #: When each kind was last scanned from the bottom or its probe launched.
        self._rescanned_at: dict[str, float] = {}
        self._probing: set[str] = set()
        #: Per kind, the lowest floor held since its last probe read the floors (and the lowest
        #: floor a poll then running started from): where the next probe may start. Missing:
        #: from the bottom (no probe yet, or since a reset).
        self._probe_from: dict[str, int] = {}
        self._probe_count: dict[str, int] = {}
        self._probes: list[threading.Thread] = []
        #: Probes run and rows they found below a floor (diagnostics, tests, benchmarks).
        self.probes_run = 0
        self.probes_found = 0
        self._running: list[PollTicket] = []
        #: Per polled kind set, what the last next-due search found (None: nothing left) while
        #: it has not passed, and when that search began (monotonic); see _remember_next().
        self._searched: dict[tuple[str, ...], int | None] = {}
        self._searched_at: dict[tuple[str, ...], float] = {}
        #: Per polled kind set, every announced time still ahead of the latest poll (a heap):
        #: when the earliest comes due, the next one is what the consumer waits for.
        self._ahead: dict[tuple[str, ...], list[int]] = {}
        #: Kind sets where an announced row came due since the last search: whoever took it
        #: holds a lease the search did not see, so a search is due (rate-limited).
        self._stale: set[tuple[str, ...]] = set()
        #: Per polled kind set, a search marker: from this time on, rows may exist that no
        #: announcement listed (a wake-up that left them out, or MAX_ANNOUNCED reached), and
        #: when it was set (monotonic); see _remember_next().
        self._search_from: dict[tuple[str, ...], tuple[int, float]] = {}
        #: Latest statement time seen: announcements at or before it are due, not "next".
        self._polled_at = -(2**63)

    def begin(self, kinds: Sequence[str]) -> PollTicket:
        """Floors for a poll of ``kinds`` (None: no floor yet, scan from the bottom), and the
        kinds whose probe is due (launched by :meth:`finish`)."""
        now = self._monotonic()
        with self._lock:
            lows: list[int | None] = []
            probe: list[str] = []
            for kind in kinds:
                low = self._low.get(kind)
                last = self._rescanned_at.get(kind)
                if low is not None and last is not None and kind not in self._probing \
                        and now - last >= self.full_rescan_interval_s:
                    probe.append(kind)
                    self._probing.add(kind)
                    self._rescanned_at[kind] = now
                lows.append(None if last is None else low)
            # The probe does not make this poll search the next due time: that search walks
            # every lease of the last acquire_timeout, acked ones too under a held snapshot.
            key = tuple(kinds)
            want = None in lows or key not in self._searched or (
                key in self._stale and now - self._searched_at.get(key, -math.inf)
                >= self.next_search_interval_s)
            ticket = PollTicket(list(kinds), lows, want_next=want, probe=probe, began=now)
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
                nxt = next_due
            else:
                nxt = self._learn(ticket, taken_max, limit, taken, polled_at, next_due, now)
        self._launch(ticket.probe)
        return nxt

    def _learn(
        self, ticket: PollTicket, taken_max: dict[str, int], limit: int, taken: int,
        polled_at: int, next_due: int | None, now: float,
    ) -> int | None:
        """The body of finish(), under the lock, for a poll that reported its statement time."""
        nxt = self._remember_next(ticket, polled_at, next_due)
        full = taken >= limit
        reached = max((i for i, k in enumerate(ticket.kinds) if k in taken_max), default=-1)
        for i, kind in enumerate(ticket.kinds):
            if full and i > reached:
                continue  # never scanned: nothing learnt
            low = taken_max[kind] if full and i == reached else polled_at
            low = min(low, ticket.lowered.get(kind, low))
            self._set_low(kind, low)
            if ticket.lows[i] is None:
                self._rescanned_at[kind] = now
        return nxt

    def _remember_next(self, ticket: PollTicket, polled_at: int, found: int | None
                       ) -> int | None:
        """The next due time to report: the earlier of what the last search found and the
        earliest announced time still ahead.

        Searching walks every lease of the last acquire_timeout (acked ones too, under a held
        snapshot: 9,000 dead index entries at 150 tasks/s and the default 60-s lease, ~3 ms),
        so it runs on a poll from the bottom, once the searched time has passed, and, at most
        every ``next_search_interval_s``, after an announced row came due. That last case is
        how an idle consumer learns of a lease another consumer took on a row it was told
        about (so it wakes when a killed consumer's lease runs out); under a steady load every
        publish is such a row, and searching on each of them made most polls walk the lease
        region (pick-up p50 3.4 -> 9.3 ms under a held snapshot). A searched time that passed
        is still returned, so the consumer polls again at once (and that poll searches); an
        announced one is not (the poll saw its row, or the consumer polls again for the
        notification that arrived during the poll). Leases taken by others without an
        announcement (a row that was already waiting) are found by the next search or, once
        expired, by any poll. Announcements during the poll are pushed here as well as by
        :meth:`lower`: lower() skips a kind set not searched yet and times at or before the
        latest poll of any kind set; a duplicate only pops twice."""
        key = tuple(ticket.kinds)
        self._polled_at = max(self._polled_at, polled_at)
        heap = self._ahead.setdefault(key, [])
        for k, at in ticket.lowered.items():
            if k in key and at > polled_at:
                heapq.heappush(heap, at)
        if ticket.want_next:
            self._searched[key], self._searched_at[key] = found, ticket.began
            self._stale.discard(key)
        passed = False
        while heap and heap[0] <= polled_at:
            # Due: this poll saw it (announced before it began) or the consumer polls again
            # for a notification that arrived meanwhile; either way no wake-up is needed.
            heapq.heappop(heap)
            passed = True
        if passed and not ticket.want_next:
            self._stale.add(key)
        ahead = heap[0] if heap else None
        mark = self._pass_marker(ticket, key, polled_at)
        searched = self._searched.get(key)
        value = min([at for at in (searched, ahead, mark) if at is not None], default=None)
        if searched is not None and searched <= polled_at:
            del self._searched[key]  # passed: reported, so the next poll, at once, searches
        if key in self._stale and key in self._searched:
            wait_s = self._searched_at[key] + self.next_search_interval_s - self._monotonic()
            retry = polled_at + max(0, math.ceil(wait_s * 1000))
            value = retry if value is None else min(value, retry)
        return value

    def _pass_marker(self, ticket: PollTicket, key: tuple[str, ...], polled_at: int
                     ) -> int | None:
        """Under the lock: the search marker of ``key`` as a time to report, or None.

        A search that began after the marker was set saw every row it stands for: the
        searched time and the searches that follow it, each when the time before passes, walk
        on through them, so the marker is done. A marker whose time passed without such a
        search is reported as passed (the consumer polls again at once) and that next poll
        searches. A marker still ahead is a time to wake at, like an announced one."""
        found = self._search_from.get(key)
        if found is None:
            return None
        at, set_at = found
        if ticket.want_next and ticket.began >= set_at:
            del self._search_from[key]
            return None
        if at <= polled_at:
            del self._search_from[key]
            self._searched.pop(key, None)
            return polled_at
        return at

    def abort(self, ticket: PollTicket) -> None:
        """A poll that failed proves nothing; keep what it saw lowered. Its probe is not
        launched (the database just failed); the next poll past the interval launches it."""
        with self._lock:
            self._drop(ticket)
            self._probing.difference_update(ticket.probe)
            for kind in ticket.probe:
                self._rescanned_at[kind] -= self.full_rescan_interval_s

    # -- the probe below the floor ----------------------------------------------------

    def _launch(self, kinds: list[str]) -> None:
        """Run the probe of ``kinds`` in a daemon thread (it may take a while, see above)."""
        if not kinds:
            return
        thread = threading.Thread(target=self._run_probe, args=(kinds,),
                                  name="delayq-watermark-probe", daemon=True)
        with self._lock:
            self._probes = [t for t in self._probes if t.is_alive()] + [thread]
        thread.start()

    def _run_probe(self, kinds: list[str]) -> None:
        """Look for due rows below the floors, from where a row could have been left.

        Since the previous probe read the floors, a row can get below the floor without an
        announcement only by being skipped (locked) by a poll and released by a rollback, and
        such a row lies at or above that poll's floor. So the probe starts at the lowest floor
        held since (or that a poll then running started from), not at the bottom of the index:
        under a held snapshot the bottom is every dead entry since the snapshot began, a walk
        that grew to ~0.3 s after 10 minutes at 150 tasks/s and showed as a pick-up p99 spike
        every probe interval. Every ``FULL_PROBE_EVERY``-th probe still starts at the bottom:
        the net for rows written without the triggers' NOTIFY (triggers disabled for a load,
        a consumer that does not listen)."""
        starts: list[tuple[str, int | None, int]] = []
        try:
            with self._lock:
                for kind in kinds:
                    if kind not in self._low:
                        continue
                    count = self._probe_count[kind] = self._probe_count.get(kind, 0) + 1
                    start = None if count % FULL_PROBE_EVERY == 0 else self._probe_from.get(kind)
                    starts.append((kind, start, self._low[kind]))
                    self._restart_probe_from(kind)
            found = self.probe([k for k, _, _ in starts], [a for _, a, _ in starts],
                               [f for _, _, f in starts]) if starts else []
            for kind, at in found:
                self.lower(kind, at)
            with self._lock:
                self.probes_run += 1
                self.probes_found += len(found)
        except Exception:  # the next probe, one interval later, tries again
            log.warning("delayq: probe below the low watermark of %s failed", kinds,
                        exc_info=True)
            with self._lock:  # what it did not cover, the next one does
                for kind, start, _ in starts:
                    if start is None:
                        self._probe_from.pop(kind, None)
                    elif kind in self._probe_from:
                        self._probe_from[kind] = min(self._probe_from[kind], start)
        finally:
            with self._lock:
                self._probing.difference_update(kinds)

    def _restart_probe_from(self, kind: str) -> None:
        """Under the lock, as a probe reads the floor of ``kind``: the next probe's start is the
        floor now or the start of a poll still running, whichever is lower, then each lower
        floor held until then (``_set_low``). A running poll from the bottom: the bottom."""
        lows = [self._low[kind]]
        for ticket in self._running:
            for k, low in zip(ticket.kinds, ticket.lows, strict=True):
                if k == kind:
                    lows.append(-(2**63) if low is None else low)
        self._probe_from[kind] = min(lows)

    def _set_low(self, kind: str, at_ms: int) -> None:
        """Under the lock: the floor of ``kind`` is now ``at_ms`` (tracked for the probe)."""
        self._low[kind] = at_ms
        if kind in self._probe_from and at_ms < self._probe_from[kind]:
            self._probe_from[kind] = at_ms

    def wait_probes(self, timeout: float) -> bool:
        """Wait for the probes launched so far (tests, benchmarks); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._probes)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def _drop(self, ticket: PollTicket) -> None:
        if ticket in self._running:
            self._running.remove(ticket)
        for kind, at in ticket.lowered.items():
            if kind in self._low and at < self._low[kind]:
                self._set_low(kind, at)

    def lower(self, kind: str, at_ms: int, *, search: bool = False) -> None:
        """A row of ``kind`` is (or will be) due at ``at_ms``: never scan above it, and report
        it as the next due time if it is the earliest known. ``search``: a search marker,
        rows from ``at_ms`` on were not announced one by one (core/queue/announce.py): the first
        poll at or after it searches for the next due time, and on from there."""
        with self._lock:
            if kind in self._low and at_ms < self._low[kind]:
                self._set_low(kind, at_ms)
            now = self._monotonic()
            # A due-now row wakes the consumer anyway: only a marker or a future time is kept
            # (the common case under load is due-now, so it skips the kind sets entirely).
            ahead = at_ms > self._polled_at
            for key in self._searched_at if search or ahead else ():
                if kind not in key:
                    continue
                heap = self._ahead.setdefault(key, [])
                if search or len(heap) >= MAX_ANNOUNCED:
                    self._mark(key, at_ms, now)  # bounded memory: search from there instead
                else:
                    heapq.heappush(heap, at_ms)
            for ticket in self._running:
                if kind in ticket.kinds and at_ms < ticket.lowered.get(kind, at_ms + 1):
                    ticket.lowered[kind] = at_ms

    def _mark(self, key: tuple[str, ...], at_ms: int, now: float) -> None:
        """Under the lock: rows of ``key`` from ``at_ms`` on may be unknown here."""
        found = self._search_from.get(key)
        self._search_from[key] = (at_ms if found is None else min(found[0], at_ms), now)

    def reset(self) -> None:
        """Forget every floor: the next poll of each kind scans from the bottom."""
        with self._lock:
            self._low.clear()
            self._rescanned_at.clear()
            self._probe_from.clear()
            self._searched.clear()
            self._searched_at.clear()
            self._ahead.clear()
            self._stale.clear()
            self._search_from.clear()
            for ticket in self._running:
                ticket.lowered.update({k: -(2**63) for k in ticket.kinds})

    def low(self, kind: str) -> int | None:
        """The current floor of ``kind`` (None: none known), for tests and diagnostics."""
        with self._lock:
            return self._low.get(kind)
