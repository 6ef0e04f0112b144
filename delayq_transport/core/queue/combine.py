"""Concurrent publishes of one process share one INSERT and one COMMIT (group commit).

Celery's thread, gevent and eventlet pools publishing subtasks, or a web server's request
threads, publish at once from one process. Each publish as its own transaction costs a commit
apiece, and commits, not round trips, are what batching saves: five publishes per transaction
cut PostgreSQL's CPU per message by 35-45% (issue 27). So the first caller writes its row at
once (no waiting when nothing else is publishing), callers arriving while that write is in
flight gather, and when it commits the first of them writes them all in one multi-row
``offer_batch_insert``. Every caller returns only after the commit that holds its row, with the
same durability it asked for (one combiner per durability). Unlike ``publish_linger``
(core/queue/publish_buffer.py) nothing returns before its row exists.

A batch that fails as a whole (a bad value the validation could not see) is not anyone's
error yet: each of its callers writes its row alone, so only the bad row's call fails.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from ..db.errors import DatabaseUnavailable

Params = dict[str, Any]
#: ``offer`` of a caller whose batch failed: it writes its row alone.
ALONE: Final = object()


class _Slot:
    __slots__ = ("params", "done", "at", "alone", "error", "batch")

    def __init__(self, params: Params, waits: bool) -> None:
        self.params = params
        self.done = threading.Event() if waits else None
        self.at: int | None = None
        self.alone = False
        self.error: BaseException | None = None
        #: Set when this caller is handed the next batch to write.
        self.batch: list[_Slot] | None = None


class OfferCombiner:
    """One process' concurrent inserts of one durability, one write in flight at a time.

    ``write_one(params)``: the single-row insert (``scheduledAt`` of the created row, or None
    when the key exists); ``write_many(params_list)``: the multi-row insert, returning
    ``(pKey, pKind, scheduledAt)`` of the created rows.
    """

    def __init__(self, write_one: Callable[[Params], int | None],
                 write_many: Callable[[list[Params]], Sequence[tuple[Any, ...]]]) -> None:
        self.write_one = write_one
        self.write_many = write_many
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._busy = False
        self._pending: list[_Slot] = []

    def offer(self, params: Params) -> int | None | object:
        """Insert one row: its ``scheduledAt`` when created, None when its key exists, or
        :data:`ALONE` when the caller must write it alone (its batch failed)."""
        if self._pid != os.getpid():  # forked while a write was in flight: start afresh
            self._reset()
        with self._lock:
            if self._busy:
                slot = _Slot(params, waits=True)
                self._pending.append(slot)
            else:
                self._busy = True
                slot = _Slot(params, waits=False)
                slot.batch = [slot]
        if slot.done is not None:
            slot.done.wait()
            if slot.batch is None:  # written by another caller
                if slot.error is not None:
                    raise slot.error
                return ALONE if slot.alone else slot.at
        assert slot.batch is not None
        return self._write(slot.batch, slot)

    def _write(self, batch: list[_Slot], own: _Slot) -> int | None | object:
        try:
            if len(batch) == 1:
                own.at = self.write_one(own.params)
            else:
                self._write_batch(batch)
        finally:
            self._hand_off()
            for slot in batch:
                if slot is not own and slot.done is not None:
                    slot.done.set()
        if own.error is not None:
            raise own.error
        return ALONE if own.alone else own.at

    def _write_batch(self, batch: list[_Slot]) -> None:
        try:
            rows = self.write_many([slot.params for slot in batch])
        except DatabaseUnavailable as exc:
            for slot in batch:  # alone they would fail the same way, one after another
                slot.error = exc
            return
        except Exception:
            for slot in batch:
                slot.alone = True
            return
        waiting: dict[tuple[str, str], list[_Slot]] = {}
        for slot in batch:
            waiting.setdefault((slot.params["key"], slot.params["kind"]), []).append(slot)
        for key, kind, at, *_ in rows:
            slots = waiting.get((key, kind))
            if slots:  # the first caller of a key repeated in the batch created it
                slots.pop(0).at = int(at)

    def _hand_off(self) -> None:
        """The write committed (or failed): the first caller that gathered meanwhile writes
        everyone who gathered; none: the next caller writes at once."""
        with self._lock:
            pending, self._pending = self._pending, []
            if not pending:
                self._busy = False
                return
        first = pending[0]
        first.batch = pending
        assert first.done is not None
        first.done.set()
