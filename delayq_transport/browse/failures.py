"""Failed tasks and what to do with them: the one service behind ``delayq tasks list --state
failed``, ``delayq tasks retry|discard``, the page's failures and the Django admin.

What "failed" means is what delayq keeps of a failure, per front end:

* **django.tasks**: a result ``FAILED`` (it raised and no retry was left), in
  ``delayq_task_results`` until the retention prunes it; listed newest first from the partial
  index of the failed results (migration 19);
* **Dramatiq and Celery**: a dead letter (formats/deadletters.py: a Dramatiq message nacked
  for good, a Celery message rejected without requeue), kept its front end's retention;
  a Celery task that failed and was acked is not delayq's: its outcome is what the app's
  result backend recorded (``delayq tasks show ID --result-backend URL`` reads it).

"Retrying" (a waiting task that failed before and runs again) is a state of a waiting row, listed
by :class:`~.service.TaskService` (``state="retrying"``) in ETA order, for all three front ends.

Retry and discard take the id a list shows and do what it names: a django.tasks result id of a
failed task (retry: its result ``READY`` again and a new row due now, in one transaction, so the
worker gives it one more attempt; discard: its result deleted), a dead letter's row id (requeue
it with its retries reset, or delete it), or a waiting task's id (retry: run it now; discard:
cancel it, and drop a django.tasks task's unfinished result).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core import DelayedQueue, InvalidInput, TaskResults
from ..core.inspect import MAX_MS, MIN_MS
from ..core.ledgers import ResultSummary, Walked
from ..formats.django_tasks import KIND_PREFIX, kind_of
from .deadletters import DeadLetter, DeadLetterService, dead_letter_queue
from .service import TaskNotFound, TaskService, TaskView, iso

#: Failed results walked per request at most (the queue and task filters apply to them).
WALK_BUDGET = 2000
DJANGO, DRAMATIQ = "django.tasks", "dramatiq"


@dataclass
class Failure:
    """One failed task, as a list and a page show it. ``ref`` is the id retry, discard and show
    take: the django.tasks result id, or ``#<row id>`` of a dead letter."""

    source: str
    ref: str
    task: str | None
    queue: str | None
    failed_at_ms: int
    attempts: int
    exception: str | None
    traceback: str | None = None
    #: Where its source's list continues after it (its keyset position there).
    position: tuple[int, str] = (0, "")

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "ref": self.ref, "task": self.task, "queue": self.queue,
                "failed_at": iso(self.failed_at_ms), "attempts": self.attempts,
                "exception": self.exception}


@dataclass
class FailurePage:
    items: list[Failure]
    next_cursor: str | None


@dataclass
class ResultPage:
    """A page of django.tasks results; ``partial``: the walk stopped before the page was full
    (``next_cursor`` continues from there)."""

    items: list[ResultSummary]
    next_cursor: str | None
    partial: bool


@dataclass
class Done:
    """What a retry or a discard did."""

    ref: str
    action: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"ref": self.ref, "action": self.action, "detail": self.detail}


# A position per source: (at_ms, id) to continue after, or None once the source is done.
Positions = dict[str, tuple[int, str] | None]


def encode_positions(positions: Positions) -> str | None:
    if all(p is None for p in positions.values()):
        return None
    raw = json.dumps({k: v for k, v in positions.items()}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_positions(text: str | None) -> Positions:
    start: tuple[int, str] = (MAX_MS, "")
    if not text:
        return {DJANGO: start, DRAMATIQ: start}
    try:
        raw = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        return {src: None if raw.get(src) is None else (int(raw[src][0]), str(raw[src][1]))
                for src in (DJANGO, DRAMATIQ)}
    except (ValueError, TypeError, KeyError, IndexError, binascii.Error) as exc:
        raise InvalidInput(f"invalid page cursor {text[:40]!r}") from exc


def exception_of(error: dict[str, str] | None) -> str | None:
    """An error of a django.tasks result in one line: its class and the traceback's last line."""
    if not error:
        return None
    last = (error.get("traceback") or "").strip().splitlines()
    return last[-1] if last else error.get("exception_class_path")


def _glob(pattern: str | None) -> Callable[[str | None], bool]:
    if not pattern:
        return lambda _name: True
    return lambda name: fnmatch.fnmatchcase(name or "", pattern)


@dataclass
class _Taken:
    """What one source gave a page: its items (newest first), and where it stopped."""

    items: list[Failure]
    more: bool
    scanned_to: tuple[int, str] | None


class FailureService:
    """Failed tasks of one queue table (see the module docstring)."""

    def __init__(self, queue: DelayedQueue, *, hide_args: bool = False) -> None:
        self.tasks = TaskService(queue, hide_args=hide_args)
        self.dead_letters = DeadLetterService(queue, hide_args=hide_args)
        self.results = TaskResults(queue, KIND_PREFIX)

    # -- the list -------------------------------------------------------------------------

    def failed_page(self, queue_name: str | None = None, task: str | None = None,
                    cursor: str | None = None, limit: int = 50) -> FailurePage:
        """Failures of every front end, newest first; ``task`` is a shell glob."""
        positions = decode_positions(cursor)
        match = _glob(task)
        taken = {DJANGO: self._django(positions[DJANGO], queue_name, match, limit),
                 DRAMATIQ: self._dramatiq(positions[DRAMATIQ], queue_name, match, limit)}
        merged = sorted((f for t in taken.values() for f in t.items),
                        key=lambda f: (f.failed_at_ms, f.ref), reverse=True)[:limit]
        return FailurePage(merged, encode_positions(
            {src: _next(positions[src], t, merged) for src, t in taken.items()}))

    def _django(self, after: tuple[int, str] | None, queue_name: str | None,
                match: Callable[[str | None], bool], limit: int) -> _Taken:
        if after is None:
            return _Taken([], False, None)
        found, more, last = self._walk("failed", after, lambda w: (
            queue_name is None or w.queue == queue_name) and match(w.task), limit)
        return _Taken([_from_result(s) for s in found], more, last)

    def _walk(self, which: str, after: tuple[int, str], keep: Callable[[Walked], bool],
              limit: int, lo: int = MIN_MS
              ) -> tuple[list[ResultSummary], bool, tuple[int, str] | None]:
        """Up to ``limit + 1`` results ``keep`` accepts among the next :data:`WALK_BUDGET`
        walked after ``after``; whether more may follow; where the walk stopped."""
        walked = self.results.walk(which, after, lo=lo, limit=WALK_BUDGET)
        hits = [w for w in walked if keep(w)][:limit + 1]
        more = len(walked) == WALK_BUDGET or len(hits) > limit
        last = (walked[-1].at_ms, walked[-1].id) if walked else None
        return self.results.summaries([w.id for w in hits]), more, last

    def results_page(self, status: str | None = None, queue_name: str | None = None,
                     task: str | None = None, since_ms: int | None = None,
                     cursor: str | None = None, limit: int = 50) -> ResultPage:
        """Finished django.tasks results (``status`` SUCCESSFUL or FAILED, or both), newest
        first, finished at or after ``since_ms``: the admin's list. The failed ones come from
        their own index; a filter the index cannot answer (queue, task, SUCCESSFUL) reads at
        most :data:`WALK_BUDGET` results a page, and a page that stopped early says so."""
        if status not in (None, "SUCCESSFUL", "FAILED"):
            raise InvalidInput(f"status must be SUCCESSFUL or FAILED, got {status!r}")
        after = decode_positions(cursor)[DJANGO]
        if after is None:
            return ResultPage([], None, False)
        match = _glob(task)
        found, more, last = self._walk(
            "failed" if status == "FAILED" else "finished", after,
            lambda w: (status is None or w.status == status) and match(w.task)
            and (queue_name is None or w.queue == queue_name), limit,
            MIN_MS if since_ms is None else since_ms)
        items = found[:limit]
        at: tuple[int, str] | None
        if len(found) > limit:
            at = (items[-1].finished_at_ms or 0, items[-1].id)
        else:
            at = last if more else None
        partial = more and len(found) <= limit
        return ResultPage(items, encode_positions({DJANGO: at, DRAMATIQ: None}), partial)

    def _dramatiq(self, after: tuple[int, str] | None, queue_name: str | None,
                  match: Callable[[str | None], bool], limit: int) -> _Taken:
        if after is None:
            return _Taken([], False, None)
        cursor = None if after[0] == MAX_MS else (after[0], int(after[1]))
        page = self.dead_letters.list_page(queue_name, cursor, limit + 1)
        items = [_from_dead_letter(d) for d in page.items if match(d.task)]
        last = (page.items[-1].row.scheduled_at_ms, str(page.items[-1].row.id)) \
            if page.items else None
        return _Taken(items, page.next_cursor is not None, last)

    # -- one failure ----------------------------------------------------------------------

    def failure(self, ref: str) -> Failure:
        """One failure with its traceback, by the ``ref`` a list shows."""
        text = str(ref).strip()
        if text.lstrip("#").isdigit():
            letter = self.dead_letters.find(text)
            return _from_dead_letter(letter, full=True)
        found = self.results.summaries([text])
        if not found or found[0].status != "FAILED":
            raise TaskNotFound(f"no failed task {text!r}: retried, discarded, pruned, or it "
                               "did not fail")
        return _from_result(found[0], full=True)

    # -- actions --------------------------------------------------------------------------

    def retry(self, ident: str) -> Done:
        """Run it again (the module docstring says how, per what ``ident`` names)."""
        text = str(ident).strip()
        target = self._target(text)
        if isinstance(target, DeadLetter):
            return Done(text, "retry", self.dead_letters.requeue(target.row.id)["detail"])
        if isinstance(target, TaskView):
            done = self.tasks.run_now(target.row.id)
            return Done(text, "retry", done.detail)
        data = target.task
        payload = json.dumps(data, separators=(",", ":")).encode()
        now = self.tasks.inspector.now_ms()
        if not self.results.reopen(target.id, kind_of(str(data["queue"]),
                                                      int(data["priority"])), payload, now):
            raise TaskNotFound(f"task {target.id} is no longer failed (retried or discarded "
                               "meanwhile)")
        return Done(text, "retry", f"task {target.id} ({data.get('task')}) due now: one more "
                                   "attempt, its result READY again")

    def discard(self, ident: str) -> Done:
        """Forget it: it does not run again (the module docstring says what goes)."""
        text = str(ident).strip()
        target = self._target(text)
        if isinstance(target, DeadLetter):
            return Done(text, "discard", self.dead_letters.delete(target.row.id)["detail"])
        if isinstance(target, TaskView) and not target.row.kind.startswith(KIND_PREFIX):
            return Done(text, "discard", self.tasks.cancel(target.row.id).detail)
        key = target.row.key if isinstance(target, TaskView) else target.id
        rows, results = self.results.discard(key)
        if not rows and not results:
            if isinstance(target, TaskView):
                self.tasks.cancel(target.row.id)  # raises TaskInFlight for a held row
            raise TaskNotFound(f"task {key} changed meanwhile (it ran or was discarded)")
        return Done(text, "discard", f"task {key} discarded: {rows} waiting row(s) and "
                                     f"{results} result(s) deleted")

    def _target(self, text: str) -> DeadLetter | TaskView | ResultSummary:
        """What ``text`` names: a dead letter or a waiting row (row id, or task id), else a
        failed django.tasks result."""
        if text.lstrip("#").isdigit():
            view = self.tasks.find(text)
            if dead_letter_queue(view.row.kind):
                return self.dead_letters.find(view.row.id)
            return view
        try:
            return self.tasks.find(text)
        except TaskNotFound:
            pass
        found = self.results.summaries([text]) if len(text) <= 200 else []
        if not found or found[0].status != "FAILED":
            raise TaskNotFound(f"no task {text!r} waiting or failed: it ran, was discarded "
                               "or pruned, or never existed")
        return found[0]


def _from_result(s: ResultSummary, *, full: bool = False) -> Failure:
    error = s.last_error or {}
    return Failure(DJANGO, s.id, s.task.get("task"), s.task.get("queue"),
                   s.finished_at_ms or s.updated_at_ms, s.attempts, exception_of(error),
                   error.get("traceback") if full else None,
                   (s.finished_at_ms or s.updated_at_ms, s.id))


def _from_dead_letter(d: DeadLetter, *, full: bool = False) -> Failure:
    return Failure(d.kind.front_end, f"#{d.row.id}", d.task, d.queue,
                   d.row.scheduled_at_initially_ms, int(d.as_dict()["retries"]) + 1,
                   d.exception, d.traceback if full else None,
                   (d.row.scheduled_at_ms, str(d.row.id)))


def _next(before: tuple[int, str] | None, taken: _Taken,
          page: list[Failure]) -> tuple[int, str] | None:
    """Where a source continues after ``page``: after its last item on the page; where it was
    if the page took none of its items; where its walk stopped if it found none; done if it
    has no more."""
    if before is None:
        return None
    ours = {id(f) for f in taken.items}
    mine = [f for f in page if id(f) in ours]
    if mine:
        exhausted = len(mine) == len(taken.items) and not taken.more
        return None if exhausted else mine[-1].position
    if taken.items:
        return before
    return taken.scanned_to if taken.more else None
