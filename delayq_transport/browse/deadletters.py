"""Dead letters of every front end: list (per queue, newest first), show, requeue, delete.

Which kinds hold dead letters, and how long each is kept, is the policy of
formats/deadletters.py: Celery's rejected messages (``<queue>.XQ``), Dramatiq's messages that
failed for good (``dramatiq:<queue>.XQ``) and the rows a django.tasks worker could not read as
a task (``django.XQ``). A Dramatiq dead letter's payload is the message as it failed:
Dramatiq's ``Retries`` middleware keeps the retry count in ``options["retries"]`` and the
traceback of each retried failure in ``options["traceback"]``; the broker's nack writes the
*final* failure's traceback there and its one-line summary in ``options["delayq_exception"]``
(dramatiq/consumer.py). A Celery dead letter is the message as it was rejected (Celery keeps
the failure in its result backend).

Requeue moves the row back to its queue due now. A Dramatiq message gets its retry state reset
(``retries``, ``traceback``, ``requeue_timestamp``, ``eta`` and delayq's own option dropped):
it starts over with its full retry budget, as if just sent, on the queue's priority-0 kind,
which every consumer of the queue polls whatever its ``max_priority`` (``broker_priority``
stays in its options, so a later retry returns to its level). A Celery message goes back as it
was, to its priority's bucket. A django.tasks dead letter is not a task: it can only be deleted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..core import InvalidInput
from ..core.inspect import MAX_MS, Inspector, TaskRow
from ..core.queue import (
    DelayedQueue,
    dead_letters_count,
    dead_letters_page,
    delete_dead_letters,
    kinds_ending,
    requeue_dead_letter,
)
from ..formats import celery, deadletters
from ..formats import dramatiq as names
from ..formats.decoders import HIDDEN, decode
from .service import TaskNotFound, iso

#: Dead letters counted per queue at most (the page shows "10000+").
COUNT_CAP = 10_000
#: Options that describe the failed attempts: dropped by a requeue so the retries start over.
RETRY_STATE = ("retries", "traceback", "requeue_timestamp", "eta", *names.FAILURE_OPTIONS)


def dead_letter_queue(kind: str) -> str | None:
    """The queue of a dead-letter kind, None for any other kind."""
    described = deadletters.describe(kind)
    return None if described is None else described.queue


@dataclass
class DeadLetter:
    """One dead letter: its row, the message it holds (None: not JSON) and its kind described."""

    row: TaskRow
    message: dict[str, Any] | None
    hide_args: bool = False

    @property
    def kind(self) -> deadletters.DeadKind:
        described = deadletters.describe(self.row.kind)
        assert described is not None  # only dead-letter rows are made into one
        return described

    @property
    def queue(self) -> str:
        return self.kind.queue

    @property
    def task(self) -> str | None:
        """The actor or task name (None: the payload is not a task)."""
        return decode(self.row.payload or b"").task

    @property
    def options(self) -> dict[str, Any]:
        return (self.message or {}).get("options") or {}

    @property
    def traceback(self) -> str | None:
        """The final failure's (the nack's), else the last one Retries wrote."""
        for option in (names.TRACEBACK_OPTION, "traceback"):
            tb = self.options.get(option)
            if isinstance(tb, str):
                return tb
        return None

    @property
    def exception(self) -> str | None:
        """The final exception in one line (delayq's option, else the traceback's last line)."""
        summary = self.options.get(names.EXCEPTION_OPTION)
        if isinstance(summary, str):
            return summary
        tb = (self.traceback or "").strip().splitlines()
        return tb[-1] if tb else None

    def as_dict(self, *, full: bool = False) -> dict[str, Any]:
        m = self.message or {}
        decoded = decode(self.row.payload or b"")
        out: dict[str, Any] = {
            "id": self.row.id, "front_end": self.kind.front_end, "queue": self.queue,
            "kind": self.row.kind, "actor": decoded.task, "message_id": decoded.task_id,
            "failed_at": iso(self.row.scheduled_at_initially_ms),
            "kept_until": iso(self.row.scheduled_at_ms),
            "retries": decoded.retries or 0, "exception": self.exception,
        }
        if full:
            out.update({
                "args": HIDDEN if self.hide_args else decoded.args,
                "kwargs": HIDDEN if self.hide_args else decoded.kwargs,
                "options": {k: v for k, v in self.options.items()
                            if k not in ("traceback", names.TRACEBACK_OPTION)},
                "traceback": self.traceback,
                "message_timestamp": m.get("message_timestamp"),
            })
        return out


@dataclass
class DeadLetterPage:
    items: list[DeadLetter]
    next_cursor: tuple[int, int] | None


def _message(payload: bytes | None) -> dict[str, Any] | None:
    try:
        data = json.loads(payload or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


class DeadLetterService:
    """Dead letters of every front end stored in one table (Dramatiq's default namespace)."""

    def __init__(self, queue: DelayedQueue, *, hide_args: bool = False) -> None:
        self.queue = queue
        self.inspector = Inspector(queue)
        self.hide_args = hide_args

    def kinds(self, queue_name: str | None = None) -> list[str]:
        """Dead-letter kinds present; with ``queue_name``, those of that queue (``q``, or
        ``dramatiq:q``/``celery:q`` for one front end's), or the kind so named."""
        found = kinds_ending(self.queue, deadletters.SUFFIX)
        if not queue_name:
            return found
        return [k for k in found if queue_name in (k, dead_letter_queue(k),
                                                   _qualified(k))]

    def queues(self) -> list[dict[str, Any]]:
        """Each queue with dead letters and their count (stops at COUNT_CAP)."""
        counts = dead_letters_count(self.queue, self.kinds(), COUNT_CAP)
        return [{"queue": dead_letter_queue(k), "front_end": _front_end(k), "kind": k,
                 "dead_letters": n,
                 "capped": n >= COUNT_CAP} for k, n in counts.items() if n]

    def list_page(self, queue_name: str | None = None, cursor: tuple[int, int] | None = None,
                  limit: int = 50) -> DeadLetterPage:
        """Newest first; ``next_cursor`` continues after the page."""
        rows = dead_letters_page(self.queue, self.kinds(queue_name),
                                            cursor or (MAX_MS, MAX_MS), limit + 1)
        items = [self._letter(TaskRow.from_row(r)) for r in rows]
        more = len(items) > limit
        items = items[:limit]
        nxt = (items[-1].row.scheduled_at_ms, items[-1].row.id) if more else None
        return DeadLetterPage(items, nxt)

    def _letter(self, row: TaskRow) -> DeadLetter:
        return DeadLetter(row, _message(row.payload), self.hide_args)

    def find(self, row_id: int | str) -> DeadLetter:
        text = str(row_id).lstrip("#")
        if not text.isdigit():
            raise InvalidInput(f"a dead letter is named by its row id (digits), not {row_id!r}")
        rows = self.inspector.by_ids([int(text)])
        if not rows or not dead_letter_queue(rows[0].kind):
            raise TaskNotFound(f"no dead letter #{text}: it was requeued, deleted or expired")
        return self._letter(rows[0])

    def requeue(self, row_id: int | str) -> dict[str, Any]:
        """Back to its queue, due now, retries reset (see the module docstring)."""
        letter = self.find(row_id)
        if letter.message is None or letter.kind.requeue_kind is None:
            raise InvalidInput(f"dead letter #{letter.row.id} is not a task (its payload could "
                               "not be read): delete it")
        message = dict(letter.message)
        to_kind = letter.kind.requeue_kind
        if letter.kind.front_end == "dramatiq":
            message["options"] = {k: v for k, v in letter.options.items()
                                  if k not in RETRY_STATE}
            message["queue_name"] = letter.queue
            payload = json.dumps(message, separators=(",", ":")).encode()
            reset = ", retries reset"
        else:  # Celery: as it was rejected, to its priority's bucket
            payload = letter.row.payload or b""
            to_kind = celery.kind_for(letter.queue, (message.get("properties") or {})
                                      .get("priority"))
            reset = ""
        at = requeue_dead_letter(self.queue, letter.row.id, letter.row.kind, to_kind,
                                            payload)
        if at is None:
            raise TaskNotFound(f"dead letter #{letter.row.id} was requeued or deleted meanwhile")
        return {"id": letter.row.id, "action": "requeue", "queue": letter.queue, "eta": iso(at),
                "detail": f"dead letter #{letter.row.id} ({letter.task}) "
                          f"requeued to {letter.queue}, due now{reset}"}

    def delete(self, row_id: int | str) -> dict[str, Any]:
        letter = self.find(row_id)
        if not delete_dead_letters(self.queue, [letter.row.id], [letter.row.kind]):
            raise TaskNotFound(f"dead letter #{letter.row.id} was requeued or deleted meanwhile")
        return {"id": letter.row.id, "action": "delete", "queue": letter.queue,
                "detail": f"dead letter #{letter.row.id} deleted"}


def _front_end(kind: str) -> str | None:
    described = deadletters.describe(kind)
    return None if described is None else described.front_end


def _qualified(kind: str) -> str | None:
    """``dramatiq:q`` or ``celery:q``: one front end's dead letters of queue ``q``."""
    described = deadletters.describe(kind)
    if described is None:
        return None
    return f"{described.front_end.split('.')[0]}:{described.queue}"
