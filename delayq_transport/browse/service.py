"""The one service behind ``delayq tasks`` and ``delayq web``: list, show, cancel, reschedule,
run now, overview, timeline. Both front ends call this; neither knows SQL.

Decisions the front ends inherit:

* a row a consumer holds (``lockUuid`` set: a worker runs or prefetched it) is never cancelled or
  moved: the action fails with :class:`TaskInFlight`, which says to revoke it through Celery
  (``celery control revoke``) or to wait; nothing is changed under a worker's feet;
* a filtered list is a bounded scan: at most ``SCAN_LIMIT`` rows are examined per request, and a
  page that stopped early says so (``partial``) and carries a cursor to continue;
* numbers are bounded counts ("10000+") or planner estimates ("≈"), never a count of the table.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..core import DelayqError, InvalidInput, TaskResults
from ..core.inspect import (
    MAX_MS,
    MIN_MS,
    Inspector,
    TaskRow,
    index_ready,
    indexed_window,
    may_match,
    plain_piece,
)
from ..core.queue import DelayedQueue, from_ms, kind_row_estimates, past_the_cap, to_ms
from ..formats import decoders
from ..formats.celery import kinds_for, queue_of_kind
from ..formats.deadletters import is_dead_letter_kind
from ..formats.django_tasks import KIND_PREFIX
from ..formats.queues import kinds_of_queue
from .filters import TaskFilter
from .occurrences import OccurrenceFold
from .rates import RateWindows

#: A filter the index cannot answer scans at most this many rows per request...
SCAN_LIMIT = 5_000
SCAN_CHUNK = 500
#: ...and stops after this long (then the page says where it stopped): a page answers in a
#: bounded time whatever the table size and however selective the filter.
SCAN_TIME_BUDGET_S = 0.15
#: A text search slice: long enough to cover ground, short enough that the page shows
#: progress (and the next slice is asked for) about every second.
SEARCH_TIME_BUDGET_S = 1.0
COUNT_CAP = 5_000
REDELIVERED_CAP = 1_000
TIMELINE_CAP = 500
MAX_WATCH = 100


class TaskNotFound(DelayqError, LookupError):
    """No row with this id or task id (it ran, was cancelled, or never existed)."""


class TaskInFlight(DelayqError):
    """A consumer holds the row: the action would change a task under a worker's feet."""


def iso(ms: int | None) -> str | None:
    return None if ms is None else from_ms(ms).isoformat(timespec="milliseconds")


@dataclass
class TaskView:
    """A row plus its decoded message, ready for a table, a page or JSON."""

    row: TaskRow
    message: decoders.DecodedMessage | None
    hide_args: bool = False

    @property
    def queue(self) -> str:
        return queue_of_kind(self.row.kind)[0]

    @property
    def eta_ms(self) -> int:
        """When it is (or was) due: the original time while a consumer holds it."""
        return self.row.scheduled_at_initially_ms if self.row.held else self.row.scheduled_at_ms

    @property
    def args_preview(self) -> str:
        if self.message is None:
            return ""
        if self.hide_args:
            return decoders.HIDDEN
        text = self.message.search_text if self.message.format == "celery" else \
            str(self.message.args)
        return text if len(text) <= 120 else text[:117] + "..."

    def as_dict(self, *, full: bool = False) -> dict[str, Any]:
        r = self.row
        out: dict[str, Any] = {
            "id": r.id, "key": r.key, "kind": r.kind, "queue": self.queue,
            "priority": queue_of_kind(r.kind)[1], "state": r.state,
            "redelivered": r.redelivered, "eta": iso(self.eta_ms),
            "task": self.message.task if self.message else None,
            "args_preview": self.args_preview,
            "retries": self.message.retries if self.message else None,
        }
        if full:
            out.update({
                "scheduled_at": iso(r.scheduled_at_ms),
                "scheduled_at_initially": iso(r.scheduled_at_initially_ms),
                "created_at": iso(r.created_at_ms), "now": iso(r.now_ms),
                "lease": None if r.lock is None else {
                    "lock": r.lock, "until": iso(r.scheduled_at_ms), "live": r.in_flight},
                "message": None if self.message is None
                else self.message.as_dict(hide_args=self.hide_args),
            })
        return out


@dataclass
class TaskPage:
    items: list[TaskView]
    next_cursor: tuple[int, int] | None
    scanned: int
    partial: bool  # the scan limit stopped it before the page was full
    indexed: bool = False  # a text search answered by the opt-in trigram index
    #: Periodic entries whose later occurrences were folded (``fold_occurrences``).
    folded: tuple[str, ...] = ()

    @property
    def searched_to(self) -> str | None:
        """How far (ETA) a partial page's scan got: the progress of a search."""
        return iso(self.next_cursor[0]) if self.partial and self.next_cursor else None


@dataclass
class ActionResult:
    id: int
    action: str
    detail: str
    eta: str | None = None


@dataclass
class Timeline:
    edges_ms: list[int]
    counts: list[int]
    estimated: list[bool]
    overdue: int
    overdue_capped: bool
    cap: int


class TaskService:
    """Task inspection and management over one queue table (all kinds)."""

    def __init__(self, queue: DelayedQueue, *, hide_args: bool = False) -> None:
        self.queue = queue
        self.inspector = Inspector(queue)
        self.hide_args = hide_args
        self._rates = RateWindows()

    # -- reading ------------------------------------------------------------------------

    def kinds(self, queue: str | None = None) -> list[str]:
        """Every kind present, or those of one queue: all its priority kinds, Celery's,
        Dramatiq's and Django's task framework's (``formats/queues.py``), or a kind by name."""
        if queue:
            present = kinds_of_queue(queue, self.inspector.kinds())
            return list(dict.fromkeys([*kinds_for(queue), *present, queue]))
        return self.inspector.kinds()

    def _view(self, row: TaskRow) -> TaskView:
        message = None if row.payload is None else decoders.decode(row.payload)
        return TaskView(row, message, self.hide_args)

    def _matches(self, f: TaskFilter, row: TaskRow, prefix: str | None,
                 bounds: tuple[int, int], retrying: frozenset[str] = frozenset()) -> bool:
        if not bounds[0] <= row.scheduled_at_ms < bounds[1]:
            return False
        if f.state == "redelivered" and not row.redelivered:
            return False
        if f.state in ("due", "scheduled", "in_flight") and row.state != f.state:
            return False
        if prefix is not None and not row.key.startswith(prefix):
            return False
        if not f.needs_payload:
            return True
        payload = row.payload or b""
        if any(part not in payload for part in _literal_parts(f.task)):
            return False  # the task name is stored verbatim: no need to decode this one
        message = decoders.decode(payload)
        if f.state == "retrying" and not _retried(row, message, retrying):
            return False
        if f.task and not fnmatch.fnmatchcase(message.task or "", f.task):
            return False
        return not f.text or f.text.lower() in message.search_text.lower()

    def list_page(self, f: TaskFilter, cursor: tuple[int, int] | None = None,
                  limit: int = 50, kinds: list[str] | None = None, *,
                  fold_occurrences: bool = False) -> TaskPage:
        """One page sorted by (ETA, id); ``next_cursor`` continues after it. ``kinds``: these
        kinds instead of the filter's queue (the Django admin leaves dead letters out).
        ``fold_occurrences``: of a periodic entry's installed occurrences only its next one
        (:mod:`.occurrences`; not with ``beat_entry``, which asks for that entry's)."""
        fold = OccurrenceFold(self.queue) if fold_occurrences and not f.beat_entry else None
        page = self._page(f, cursor, limit, fold, kinds)
        if fold is not None:
            page.folded = tuple(sorted(fold.folded))
        return page

    def _page(self, f: TaskFilter, cursor: tuple[int, int] | None, limit: int,
              fold: OccurrenceFold | None, kinds: list[str] | None) -> TaskPage:
        if f.text and self.hide_args:
            raise InvalidInput("searching task arguments is disabled (arguments are hidden)")
        kinds = self.kinds(f.queue) if kinds is None else kinds
        lo, hi = f.bounds_ms(self.inspector.now_ms())
        lo, hi = MIN_MS if lo is None else lo, MAX_MS if hi is None else hi
        after = cursor or (MIN_MS, MIN_MS)
        prefix = _beat_prefix(f.beat_entry)
        if not f.narrows and fold is None:
            rows = self.inspector.window(kinds, after=after, lo=lo, hi=hi, budget=limit + 1)
            page = rows[:limit]
            more = len(rows) > limit
            return TaskPage(self._with_payloads(page), _pos(page[-1]) if more else None,
                            len(rows), False)
        piece = plain_piece(f.text) if f.text else None
        indexed = piece is not None and f.state != "in_flight" and index_ready(self.queue)
        found: list[TaskRow] = []
        scanned = 0
        # A text search keeps going for about a second per request (the page asks for the next
        # slice by itself); other filters answer within the page budget.
        budget_s, row_cap = (SEARCH_TIME_BUDGET_S, None) if f.text else \
            (SCAN_TIME_BUDGET_S, SCAN_LIMIT)
        deadline = time.monotonic() + budget_s
        while (scanned == 0 or time.monotonic() < deadline) and \
                (row_cap is None or scanned < row_cap):
            hits = None
            if indexed and piece is not None:
                hits = indexed_window(self.queue, kinds, piece=piece, after=after, lo=lo,
                                             hi=hi, budget=SCAN_CHUNK)
                indexed = hits is not None  # None: too common a text, the scan finds it
            rows = self._chunk(f, kinds, after, lo, hi) if hits is None else hits
            retrying = self._retrying_keys(rows) if f.state == "retrying" else frozenset()
            for row in rows:
                scanned += 1
                after = _pos(row)
                if may_match(row.payload, piece) and \
                        self._matches(f, row, prefix, (lo, hi), retrying) and \
                        not (fold is not None and fold.hides(row)):
                    found.append(row)
                    if len(found) == limit:
                        return TaskPage(self._with_payloads(found), after, scanned, False,
                                        indexed)
            if len(rows) < SCAN_CHUNK:
                return TaskPage(self._with_payloads(found), None, scanned, False, indexed)
        return TaskPage(self._with_payloads(found), after, scanned, True, indexed)

    def _chunk(self, f: TaskFilter, kinds: list[str], after: tuple[int, int], lo: int,
               hi: int) -> list[TaskRow]:
        """The next rows to examine: in-flight rows come from the lockUuid index (held rows are
        few), everything else from the keyset window."""
        if f.state == "in_flight":
            rows = self.inspector.held(kinds, after=after, budget=SCAN_CHUNK)
            if f.needs_payload:
                rows = self.inspector.by_ids([r.id for r in rows])
            return rows
        return self.inspector.window(kinds, after=after, lo=lo, hi=hi, budget=SCAN_CHUNK,
                                     with_payload=f.needs_payload)

    def _retrying_keys(self, rows: list[TaskRow]) -> frozenset[str]:
        """The django.tasks rows among ``rows`` whose task failed before and waits for its
        retry (their result READY with an error): a django.tasks message carries no retry
        count, its result does."""
        keys = [r.key for r in rows if r.kind.startswith(KIND_PREFIX)]
        if not keys:
            return frozenset()
        results = TaskResults(self.queue, KIND_PREFIX).summaries(keys)
        return frozenset(r.id for r in results if r.status == "READY" and r.errors)

    def _with_payloads(self, rows: list[TaskRow]) -> list[TaskView]:
        missing = [r.id for r in rows if r.payload is None]
        if missing:
            full = {r.id: r for r in self.inspector.by_ids(missing)}
            rows = [full.get(r.id, r) for r in rows]
        return [self._view(r) for r in rows]

    def iter_matching(self, f: TaskFilter, chunk: int = 500) -> Iterator[TaskView]:
        """Every match, page after page (the CLI's bulk cancel walks this)."""
        cursor = None
        while True:
            page = self.list_page(f, cursor, chunk)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def find(self, ident: str | int) -> TaskView:
        """By row id (digits, or ``#123``) or by key (a Celery task id)."""
        text = str(ident).strip()
        if text.lstrip("#").isdigit():
            rows = self.inspector.by_ids([int(text.lstrip("#"))])
        else:
            rows = self.inspector.by_key(text)
        if not rows:
            raise TaskNotFound(f"no task {text!r}: it ran, was cancelled, or never existed")
        if len(rows) > 1:
            waiting = [r for r in rows if not r.held]
            rows = waiting or rows
        return self._view(rows[0])

    def watch(self, keys: list[str]) -> list[tuple[str, TaskView | None]]:
        """Each task id with its row, or None once it left the queue (ran, or cancelled)."""
        if len(keys) > MAX_WATCH:
            raise InvalidInput(f"watch at most {MAX_WATCH} task ids at once")
        rows: dict[str, TaskRow] = {}
        for row in self.inspector.by_keys(keys):
            rows.setdefault(row.key, row)
        return [(k, self._view(rows[k]) if k in rows else None) for k in keys]

    # -- actions ------------------------------------------------------------------------

    def _refuse_held(self, view: TaskView, action: str) -> None:
        if view.row.held:
            raise TaskInFlight(
                f"task {view.row.key} (#{view.row.id}) is in flight: a worker holds it "
                f"(lock {view.row.lock}, lease until {iso(view.row.scheduled_at_ms)}), so it is "
                f"not {action} under the worker's feet. Revoke it with `celery control revoke "
                f"{view.row.key}` or wait for it to finish.")

    def cancel(self, ident: str | int) -> ActionResult:
        view = self.find(ident)
        self._refuse_held(view, "cancelled")
        if not self.inspector.cancel([view.row.id]):
            self._refuse_held(self.find(view.row.id), "cancelled")
            raise TaskNotFound(f"task #{view.row.id} is gone (it ran or was cancelled)")
        return ActionResult(view.row.id, "cancel", f"task {view.row.key} cancelled")

    def reschedule(self, ident: str | int, at: datetime) -> ActionResult:
        """Move a waiting task to ``at`` (its message's ETA moves with it)."""
        at_ms = to_ms(at, what="new time")
        view = self.find(ident)
        self._refuse_held(view, "moved")
        assert view.row.payload is not None
        at = from_ms(at_ms)
        payload = decoders.with_eta(view.row.payload, at)
        if payload is None:
            raise InvalidInput(f"task #{view.row.id}: no decoder can set the time of this "
                               "message format")
        if not self.inspector.reschedule(view.row, at_ms, payload):
            self._refuse_held(self.find(view.row.id), "moved")
            raise TaskNotFound(f"task #{view.row.id} changed meanwhile (it was retried or ran)"
                               "; look again")
        detail = f"task {view.row.key} now due at {iso(at_ms)}"
        expires = view.message.expires if view.message else None
        if expires and datetime.fromisoformat(expires).astimezone(UTC) < at:
            detail += f" (warning: it expires at {expires}, so a worker will discard it)"
        return ActionResult(view.row.id, "reschedule", detail, iso(at_ms))

    def reschedule_in(self, ident: str | int, delay: timedelta) -> ActionResult:
        return self.reschedule(ident, from_ms(self.inspector.now_ms()) + delay)

    def run_now(self, ident: str | int) -> ActionResult:
        result = self.reschedule(ident, from_ms(self.inspector.now_ms()))
        result.action = "run_now"
        return result

    # -- overview and timeline ----------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        kinds = self.inspector.kinds()
        per_kind = self.inspector.overview(kinds, COUNT_CAP, REDELIVERED_CAP)
        stats = self.inspector.stats()
        self._rates.add(stats.inserted, stats.deleted)
        windows = self._rates.windows()
        capped = [k.kind for k in per_kind if COUNT_CAP in (k.due, k.later)]
        guesses = kind_row_estimates(self.queue, capped) if capped else {}
        queues: dict[str, dict[str, Any]] = {}
        for k in per_kind:
            name = queue_of_kind(k.kind)[0]
            q = queues.setdefault(name, {"queue": name, "kinds": [], "due": 0, "scheduled": 0,
                                         "in_flight": 0, "redelivered": 0, "capped": False,
                                         "due_estimated": False,
                                         "scheduled_estimated": False, "oldest_due_lag_ms": None,
                                         "next_due_at": None})
            q["kinds"].append(k.kind)
            due, scheduled = past_the_cap(k, guesses.get(k.kind), stats, COUNT_CAP)
            q["due"] += due
            q["scheduled"] += scheduled
            q["due_estimated"] = q["due_estimated"] or due != k.due
            q["scheduled_estimated"] = q["scheduled_estimated"] or scheduled != k.scheduled
            q["in_flight"] += k.in_flight
            q["redelivered"] += k.redelivered
            q["capped"] = q["capped"] or COUNT_CAP in (k.due, k.later)
            if k.oldest_due_lag_ms is not None:
                q["oldest_due_lag_ms"] = max(q["oldest_due_lag_ms"] or 0, k.oldest_due_lag_ms)
            if k.next_due_at_ms is not None:
                q["next_due_at"] = min(filter(None, [q["next_due_at"], iso(k.next_due_at_ms)]))
        return {"now": iso(stats.now_ms), "cap": COUNT_CAP,
                "rows_estimate": max(stats.rows_estimate, stats.live_estimate),
                "rates": windows[0] if windows else None, "rate_windows": windows,
                "queues": sorted(queues.values(), key=lambda q: q["queue"])}

    def timeline(self, hours: float = 24, buckets: int = 48,
                 queue: str | None = None) -> Timeline:
        if not 0 < hours <= 24 * 31 or not 1 <= buckets <= 200:
            raise InvalidInput("timeline: hours must be in (0, 744], buckets in 1..200")
        kinds = self.kinds(queue)
        now = self.inspector.now_ms()
        step = max(int(hours * 3_600_000 / buckets), 1000)
        start = now - now % step
        edges = [start + i * step for i in range(buckets + 1)]
        counts = self.inspector.timeline(kinds, edges, TIMELINE_CAP)
        overdue = self.inspector.timeline(kinds, [MIN_MS, now], COUNT_CAP)[0]
        estimated = [c >= TIMELINE_CAP for c in counts]
        if any(estimated):
            stats = self.inspector.stats()
            counts = [max(c, stats.estimate_between(lo, hi)) if est else c
                      for c, est, lo, hi in zip(counts, estimated, edges, edges[1:], strict=False)]
        return Timeline(edges, counts, estimated, overdue, overdue >= COUNT_CAP, TIMELINE_CAP)


def _literal_parts(pattern: str | None) -> list[bytes]:
    """Pieces of a task-name glob that any matching payload contains byte for byte (names made
    of JSON-safe characters are stored unescaped), so most rows are skipped undecoded."""
    if not pattern:
        return []
    return [p.encode() for p in re.split(r"[*?\[\]]+", pattern)
            if p and re.fullmatch(r"[A-Za-z0-9_.:\-]+", p)]


def kept_kind(kind: str) -> bool:
    """A kind whose rows are kept, never consumed: dead letters (formats/deadletters.py), not
    waiting tasks."""
    return is_dead_letter_kind(kind)


def _retried(row: TaskRow, message: decoders.DecodedMessage,
             retrying: frozenset[str]) -> bool:
    """A waiting task that failed before: a django.tasks one by its result (``retrying``), a
    Celery or Dramatiq one by the retry count its message carries (a dead letter's is the
    count it failed with: it waits for nothing)."""
    if kept_kind(row.kind):
        return False
    if row.kind.startswith(KIND_PREFIX):
        return row.key in retrying
    return (message.retries or 0) >= 1


def _pos(row: TaskRow) -> tuple[int, int]:
    return row.scheduled_at_ms, row.id


def _beat_prefix(entry: str | None) -> str | None:
    if not entry:
        return None
    from ..scheduling.entries import key_prefix  # the engine owns its key format

    return key_prefix(entry) + "/"
