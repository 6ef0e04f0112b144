"""Bulk actions: cancel, reschedule (to a time, or by a shift) or run now, on chosen rows or on
every match of a filter. ``delayq tasks cancel`` with filters and the web page's bulk bar
both come here.

Guarantees, as for one task (:class:`~.service.TaskService`): a row a worker holds is left
alone and counted as in flight; a row that ran or changed meanwhile is counted as gone; a
moved row's message gets the new ``eta`` header (:func:`.decoders.with_eta`). Every statement
touches at most :data:`BATCH` rows (a cancel) or :data:`MOVE_BATCH` (a move), each its own
short transaction, so a million matches never make one giant transaction nor hold locks for
long. The targets are collected before anything changes: a row rescheduled later in the ETA
order is not met (and shifted) twice. A filter's matches are collected with the ETA and
creation time each had when it matched, and a row that moved or was replaced since (a worker
took and released it, a retry replaced it, someone rescheduled it) is no longer what was
selected: it is left alone and counted as changed. The web page runs large selections in the
background (``web/jobs.py``), where that gap lasts.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from ..core import InvalidInput
from ..core.inspect import MAX_MS, MIN_MS, TaskRow
from ..core.queue import from_ms, kind_row_estimates, to_ms
from ..formats import decoders
from .filters import TaskFilter, parse_duration, parse_when
from .service import TaskService

ACTIONS = ("cancel", "reschedule", "run_now")
#: Rows per delete statement (a cancel), each its own transaction of some tens of ms. The
#: commit is a WAL flush, so fewer rows per statement cost more per row: 63, 34 and 17-28 us a
#: row at 100, 500 and 2,000 (a busy 2-core VM).
BATCH = 2_000
#: Rows per update statement (reschedule, run now): each row carries its new payload, and an
#: update costs several times a delete, so fewer keep its transaction as short.
MOVE_BATCH = 500
#: Most rows one bulk action collects (held in memory as arrays: ~24 MB at the cap).
MAX_TARGETS = 1_000_000
#: A preview counts exactly up to here, then estimates (index-answered filters)...
PREVIEW_CAP = 100_000
#: ...or scans this long for filters the index cannot answer.
PREVIEW_SCAN_S = 0.25
_WINDOW = 5_000


@dataclass
class BulkResult:
    action: str
    matched: int
    done: int
    in_flight: int  # a worker holds them: left alone
    gone: int  # ran, were cancelled or replaced meanwhile
    unsupported: int = 0  # no decoder can set their message's time

    @property
    def detail(self) -> str:
        verb = {"cancel": "cancelled", "reschedule": "rescheduled",
                "run_now": "made due now"}[self.action]
        parts = [f"{verb} {self.done:,} task(s)"]
        if self.in_flight:
            parts.append(f"{self.in_flight:,} in flight were left alone")
        if self.gone:
            parts.append(f"{self.gone:,} had already left the queue or changed")
        if self.unsupported:
            parts.append(f"{self.unsupported:,} have a message format that cannot be moved")
        return "; ".join(parts)

    @property
    def processed(self) -> int:
        """Rows looked at so far (changed, or found held, gone or unmovable)."""
        return self.done + self.in_flight + self.gone + self.unsupported

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "detail": self.detail}


@dataclass
class Targets:
    """The rows an action is for. Chosen rows are ids only (the user picked those tasks); a
    filter's matches also carry the ETA and creation time each had when it matched, so the
    action leaves alone a row that moved or was replaced since."""

    ids: array[int] = field(default_factory=lambda: array("q"))
    at: array[int] | None = None
    created: array[int] | None = None

    @classmethod
    def chosen(cls, ids: Sequence[int]) -> Targets:
        return cls(array("q", ids))

    @classmethod
    def matches(cls) -> Targets:
        return cls(array("q"), array("q"), array("q"))

    def add(self, row: tuple[int, int, int]) -> None:
        """One match: (id, ETA ms, creation time ms)."""
        self.ids.append(row[0])
        if self.at is not None and self.created is not None:
            self.at.append(row[1])
            self.created.append(row[2])

    def part(self, start: int, stop: int) -> Targets:
        if self.at is None or self.created is None:
            return Targets(self.ids[start:stop])
        return Targets(self.ids[start:stop], self.at[start:stop], self.created[start:stop])

    def expected(self) -> dict[int, tuple[int, int]] | None:
        """id -> (ETA, creation time) as matched; None for chosen rows."""
        if self.at is None or self.created is None:
            return None
        return {i: (a, c) for i, a, c in zip(self.ids, self.at, self.created, strict=True)}

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class BulkPreview:
    """What a confirmation shows: how many rows an action would touch."""

    count: int
    exact: bool  # False: an estimate (≈), or at least ``count`` (a scan that did not finish)
    in_flight: int

    @property
    def label(self) -> str:
        if self.exact:
            return f"{self.count:,}"
        return f"≈{self.count:,}" if self.count > PREVIEW_CAP else f"at least {self.count:,}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


def parse_target_time(action: str, at: str | None, shift: str | None) -> tuple[int | None,
                                                                               int | None]:
    """(absolute time ms, shift ms) of a reschedule: ``at`` an ISO time, or ``shift`` like
    ``+2h`` / ``-30m``; neither for cancel and run now."""
    if action not in ACTIONS:
        raise InvalidInput(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
    if action != "reschedule":
        return None, None
    if bool(at) == bool(shift):
        raise InvalidInput("reschedule: give a new time (at) or a shift such as +2h or -30m")
    if at:
        return to_ms(parse_when(at, "at"), what="at"), None
    text = str(shift).strip()
    sign = -1 if text.startswith("-") else 1
    delta: timedelta = parse_duration(text.lstrip("+-"), "shift")
    return None, sign * int(delta.total_seconds() * 1000)


def target_ids(svc: TaskService, f: TaskFilter, cap: int = MAX_TARGETS,
               progress: Callable[[int], None] | None = None) -> Targets:
    """Every row matching ``f`` (held ones included: they are reported, not touched), as it
    was when it matched; ``progress`` hears the count every few thousand rows."""
    out = Targets.matches()
    rows = ((v.row.id, v.row.scheduled_at_ms, v.row.created_at_ms)
            for v in svc.iter_matching(f)) if f.narrows else _windows(svc, f)
    for row in rows:
        out.add(row)
        if len(out) > cap:
            raise InvalidInput(f"more than {cap:,} tasks match: narrow the filter")
        if progress is not None and len(out) % _WINDOW == 0:
            progress(len(out))
    return out


def _windows(svc: TaskService, f: TaskFilter) -> Iterator[tuple[int, int, int]]:
    """(id, ETA, creation time) of the rows of an index-answered filter (queue, ETA range),
    in keyset windows, one kind after the other: an action needs no order across kinds."""
    lo, hi = f.bounds_ms(svc.inspector.now_ms())
    lo, hi = MIN_MS if lo is None else lo, MAX_MS if hi is None else hi
    for kind in svc.kinds(f.queue):
        after = (MIN_MS, MIN_MS)
        while True:
            rows = svc.inspector.match_window(kind, after=after, lo=lo, hi=hi, budget=_WINDOW)
            yield from rows
            if len(rows) < _WINDOW:
                break
            after = (rows[-1][1], rows[-1][0])


def preview(svc: TaskService, f: TaskFilter | None = None,
            ids: list[int] | None = None, scan_s: float = PREVIEW_SCAN_S) -> BulkPreview:
    """The count a confirmation shows, within a page's time budget (``scan_s`` for filters
    the index cannot answer)."""
    if ids is not None:
        rows = svc.inspector.by_ids(ids[:MAX_TARGETS])
        return BulkPreview(len(rows), True, sum(r.held for r in rows))
    assert f is not None
    if f.narrows:
        return _scan_count(svc, f, scan_s)
    lo, hi = f.bounds_ms(svc.inspector.now_ms())
    lo, hi = MIN_MS if lo is None else lo, MAX_MS if hi is None else hi
    kinds = svc.kinds(f.queue)
    counted = svc.inspector.timeline(kinds, [lo, hi], PREVIEW_CAP)[0]
    held = [r for r in svc.inspector.held(kinds, budget=1000) if lo <= r.scheduled_at_ms < hi]
    if counted < PREVIEW_CAP:
        return BulkPreview(counted, True, len(held))
    stats = svc.inspector.stats()
    share = 1.0
    if f.queue:
        per_kind = kind_row_estimates(svc.queue, kinds)
        total = max(stats.rows_estimate, stats.live_estimate, 1)
        share = min(sum(per_kind.values()) / total, 1.0) if per_kind else 1.0
    return BulkPreview(max(counted, round(stats.estimate_between(lo, hi) * share)), False,
                       len(held))


def _scan_count(svc: TaskService, f: TaskFilter, scan_s: float) -> BulkPreview:
    count = held = 0
    cursor = None
    deadline = time.monotonic() + scan_s
    while True:
        page = svc.list_page(f, cursor, 500)
        count += len(page.items)
        held += sum(v.row.held for v in page.items)
        if page.next_cursor is None:
            return BulkPreview(count, True, held)
        if time.monotonic() > deadline:
            return BulkPreview(count, False, held)
        cursor = page.next_cursor


def apply(svc: TaskService, action: str, targets: Targets | Sequence[int], *,
          at_ms: int | None = None, shift_ms: int | None = None,
          progress: Callable[[BulkResult], None] | None = None) -> BulkResult:
    """Apply ``action`` to ``targets``, :data:`BATCH` or :data:`MOVE_BATCH` rows per statement
    (each its own transaction); ``progress`` hears the running result after each batch."""
    if action not in ACTIONS:
        raise InvalidInput(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
    if not isinstance(targets, Targets):
        targets = Targets.chosen(targets)
    result = BulkResult(action, len(targets), 0, 0, 0)
    now_ms = svc.inspector.now_ms()
    step = BATCH if action == "cancel" else MOVE_BATCH
    for start in range(0, len(targets), step):
        batch = targets.part(start, start + step)
        ids = batch.ids.tolist()
        if action == "cancel":
            if batch.at is None or batch.created is None:
                done = set(svc.inspector.cancel(ids))
            else:
                done = set(svc.inspector.cancel_unchanged(ids, batch.at.tolist(),
                                                          batch.created.tolist()))
            result.done += len(done)
            _count_missed(svc, [i for i in ids if i not in done], result)
        else:
            _move(svc, batch, now_ms if action == "run_now" else at_ms, shift_ms, result)
        if progress is not None:
            progress(result)
    return result


def _count_missed(svc: TaskService, ids: list[int], result: BulkResult) -> None:
    """Rows an action did not change: held by a worker, or gone (or changed since matched)."""
    if not ids:
        return
    held = sum(r.held for r in svc.inspector.by_ids(ids))
    result.in_flight += held
    result.gone += len(ids) - held


def _move(svc: TaskService, batch: Targets, at_ms: int | None, shift_ms: int | None,
          result: BulkResult) -> None:
    rows = svc.inspector.by_ids(batch.ids.tolist())
    expected = batch.expected()
    if expected is not None:  # moved or replaced since it matched: not what was selected
        rows = [r for r in rows if expected[r.id] == (r.scheduled_at_ms, r.created_at_ms)
                or r.held]
    result.gone += len(batch) - len(rows)
    moves: list[tuple[TaskRow, int, bytes]] = []
    for row in rows:
        if row.held:
            result.in_flight += 1
            continue
        new_at = at_ms if at_ms is not None else row.scheduled_at_ms + (shift_ms or 0)
        payload = decoders.with_eta(row.payload or b"", from_ms(new_at))
        if payload is None:
            result.unsupported += 1
        else:
            moves.append((row, new_at, payload))
    done = set(svc.inspector.reschedule_many(moves))
    result.done += len(done)
    _count_missed(svc, [row.id for row, _, _ in moves if row.id not in done], result)
