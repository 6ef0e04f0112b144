"""Buffered publishes: offers collected for a few milliseconds and written as one statement.

Why: a publish is otherwise one round trip and one single-row INSERT with its own commit and
NOTIFY; a producer sending tasks one by one pays that per task in its own CPU, in its backend's
and in the listening backends' (``docs/benchmarks.md``, *Celery against RabbitMQ: the latest
runs*). Buffered, the rows of ``linger`` seconds go out as one multi-row insert per kind
(``offer_batch``): one round trip, one commit, one NOTIFY per statement.

What it costs, and why it is off by default: ``put`` returns before the row is written. A
process killed meanwhile loses what it buffered (at most ``linger`` seconds of publishes, plus
whatever a database outage kept back), and a write error surfaces in the log, not in the
caller. Bad input still raises in the caller (keys and payloads are checked in ``put``). While
the database is unreachable the buffer keeps retrying; once ``max_pending`` publishes wait,
``put`` blocks up to ``put_timeout`` and then raises :class:`~..db.errors.DatabaseUnavailable`.
``flush`` writes everything accepted so far and waits for it; ``close`` and interpreter exit
flush too, and so does the exit of a multiprocessing or billiard child (Celery's prefork pool).
A forked child starts with an empty buffer (its parent writes what it accepted).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from ..db.errors import DatabaseUnavailable, DelayqError, InvalidInput
from .joined import current
from .validate import validate_key, validate_kind, validate_payload

if TYPE_CHECKING:
    from .delayed_queue import DelayedQueue

log = logging.getLogger(__name__)

#: The longest linger accepted: beyond this a "buffer" is a delay nobody asked for.
MAX_LINGER_S = 1.0
#: Rows per statement (``offer_batch`` chunks at 1,000 as well).
DEFAULT_MAX_BATCH = 1000
#: Publishes held before ``put`` blocks (bounded memory while the database is away).
DEFAULT_MAX_PENDING = 100_000
DEFAULT_PUT_TIMEOUT_S = 10.0
#: How long interpreter exit waits for the last write.
EXIT_FLUSH_TIMEOUT_S = 10.0
#: Retry backoff after a failed write: doubles from the linger up to this.
MAX_RETRY_S = 5.0


class _Pending(NamedTuple):
    seq: int  # order of put: flush() waits for every item up to its call
    kind: str
    key: str
    payload: bytes
    at: datetime | None
    can_update: bool

    @property
    def statement(self) -> tuple[str, bool]:
        """Items with equal values here go out in one ``offer_batch``."""
        return self.kind, self.can_update


def check_linger(value: object, *, durable_publish: bool = False,
                 what: str = "publish_linger") -> float:
    """Seconds, 0 (off) up to :data:`MAX_LINGER_S`; anything else is refused by name, and so is
    a linger together with ``durable_publish`` (the adapters' option for a flushed commit)."""
    try:
        linger = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidInput(f"{what} must be a number of seconds, got {value!r}") from None
    if not 0 <= linger <= MAX_LINGER_S:
        raise InvalidInput(f"{what} must be between 0 (off) and {MAX_LINGER_S} s, got {value!r}")
    if linger and durable_publish:
        raise InvalidInput(f"durable_publish=True waits for each publish to reach the disk; "
                           f"{what} returns before it is written: choose one")
    return linger


class PublishBuffer:
    """Offers of one process, written by one background thread in batches (see the module)."""

    def __init__(
        self,
        queue_for: Callable[[str], DelayedQueue],
        linger: float,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_pending: int = DEFAULT_MAX_PENDING,
        put_timeout: float = DEFAULT_PUT_TIMEOUT_S,
    ) -> None:
        self.linger = check_linger(linger)
        if self.linger <= 0:
            raise InvalidInput("PublishBuffer needs a linger above 0 (0 means: do not buffer)")
        self._queue_for = queue_for
        self.max_batch = max(1, int(max_batch))
        self.max_pending = max(self.max_batch, int(max_pending))
        self.put_timeout = float(put_timeout)
        self._reset()
        _live.add(self)
        _flush_when_a_child_exits()

    def _reset(self) -> None:
        """Fresh state (also in a forked child: the parent writes what it had accepted)."""
        self._cond = threading.Condition()
        self._items: list[_Pending] = []
        self._first_at = 0.0
        self._seq = 0  # publishes put so far
        self._inflight: list[_Pending] = []  # taken by the writer, not yet written
        self._urgent = 0  # flush() calls waiting: write without lingering
        self._closed = False
        self._failing_since: float | None = None
        self._thread: threading.Thread | None = None

    # -- producer side ---------------------------------------------------------------------

    def put(self, kind: str, key: str, payload: bytes, at: datetime | None = None, *,
            can_update: bool = True) -> None:
        """Accept one offer for the next write; raises only on bad input, after ``close``, or
        when ``max_pending`` publishes still wait after ``put_timeout``. Inside the caller's
        transaction (core/queue/joined.py) the offer is written now, in it, not buffered."""
        if current() is not None:
            self._queue_for(kind).offer(key, payload, at, can_update=can_update)
            return
        kind, key = validate_kind(kind), validate_key(key)
        payload = validate_payload(payload)
        with self._cond:
            if self._closed:
                raise DelayqError("the publish buffer is closed")
            if self._held() >= self.max_pending:
                self._wait_for_room()
            if not self._items:
                self._first_at = time.monotonic()
            self._seq += 1
            self._items.append(_Pending(self._seq, kind, key, payload, at, can_update))
            if self._thread is None:
                self._start()
            if len(self._items) == 1 or len(self._items) >= self.max_batch:
                self._cond.notify_all()

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self.put_timeout
        while self._held() >= self.max_pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DatabaseUnavailable(
                    f"{self._held()} buffered publishes are waiting to be written (the "
                    f"limit is {self.max_pending}); the database has not accepted a write for "
                    f"{self._failing_for():.0f} s")
            self._cond.wait(left)

    def _failing_for(self) -> float:
        since = self._failing_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def pending(self) -> int:
        """Publishes accepted and not yet written."""
        with self._cond:
            return self._held()

    def _held(self) -> int:
        return len(self._items) + len(self._inflight)

    def _oldest(self) -> float:
        """The seq of the oldest publish not yet written (unwritten ones go back in front)."""
        heads = [q[0].seq for q in (self._items, self._inflight) if q]
        return min(heads) if heads else float("inf")

    def flush(self, timeout: float | None = None) -> bool:
        """Write everything accepted so far now; True once it is written, False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._seq
            if self._oldest() > target:
                return True
            if self._thread is None or not self._thread.is_alive():
                self._start()
            self._urgent += 1
            self._cond.notify_all()
            try:
                while self._oldest() <= target:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._urgent -= 1

    def close(self, timeout: float = EXIT_FLUSH_TIMEOUT_S) -> None:
        """Flush, then stop the writer; what could not be written in time is logged as lost."""
        if not self.flush(timeout):
            log.error("delayq: %d buffered publish(es) could not be written within %.0f s and "
                      "are lost", self.pending, timeout)
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()
        _live.discard(self)

    # -- the writer thread -----------------------------------------------------------------

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="delayq-publish", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff = self.linger
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            unwritten = self._write(batch)
            with self._cond:
                self._inflight = []
                if unwritten:
                    self._items[:0] = unwritten  # first in line for the next attempt
                    if self._failing_since is None:
                        self._failing_since = time.monotonic()
                else:
                    self._failing_since = None
                self._cond.notify_all()
                if unwritten:
                    self._cond.wait(backoff)  # a flush() or close() cuts the pause short
                    backoff = min(backoff * 2, MAX_RETRY_S)
                else:
                    backoff = self.linger

    def _next_batch(self) -> list[_Pending] | None:
        """Wait for the first item, then until it has lingered, the batch is full or someone
        flushes; None when closed."""
        with self._cond:
            while not self._items:
                if self._closed:
                    return None
                self._cond.wait()
            due = self._first_at + self.linger
            while len(self._items) < self.max_batch and not self._urgent and not self._closed:
                left = due - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._items = self._items[: self.max_batch], self._items[self.max_batch :]
            self._first_at = time.monotonic()
            self._inflight = batch
            return batch

    def _write(self, batch: list[_Pending]) -> list[_Pending]:
        """One ``offer_batch`` per (kind, can_update), each in the order of ``put``, committed
        without waiting for the WAL flush (the caller did not wait for the write at all);
        returns what could not be written, in that order."""
        groups: dict[tuple[str, bool], list[_Pending]] = {}
        for item in batch:
            groups.setdefault(item.statement, []).append(item)
        unwritten: list[_Pending] = []
        for (kind, can_update), items in groups.items():
            if unwritten:  # an earlier group failed: the database will refuse this one too
                unwritten += items
                continue
            try:
                self._queue_for(kind).offer_batch([(p.key, p.payload, p.at) for p in items],
                                                  can_update=can_update, durable=False)
            except DelayqError as exc:
                log.warning("delayq: writing %d buffered publish(es) failed, retrying: %s",
                            len(items), exc)
                unwritten += items
            except Exception:  # a bug must not kill the writer and strand every later publish
                log.exception("delayq: writing %d buffered publish(es) failed, retrying",
                              len(items))
                unwritten += items
        return unwritten


#: Buffers of this process, flushed at exit and emptied in a forked child.
_live: weakref.WeakSet[PublishBuffer] = weakref.WeakSet()
#: The process whose multiprocessing exit hook is registered (see below).
_hooked_pid = 0


@atexit.register
def _flush_at_exit() -> None:
    for buffer in list(_live):
        buffer.close(EXIT_FLUSH_TIMEOUT_S)


def _flush_when_a_child_exits() -> None:
    """A multiprocessing or billiard child (Celery's prefork pool) ends with ``os._exit``, which
    skips ``atexit``; it runs multiprocessing's finalizers first. The child clears the
    registry it inherited, so each process that makes a buffer registers its own."""
    global _hooked_pid
    if _hooked_pid != os.getpid():
        _hooked_pid = os.getpid()
        multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=100)


def _after_fork_in_child() -> None:
    for buffer in list(_live):
        buffer._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
