"""The attempts a ``django.tasks`` worker runs, as their results show them: a result tells the
truth while its task runs, after its worker is killed, and after a shutdown gives it back.

Django's ``TaskResultStatus`` has no INTERRUPTED. An interrupted attempt reads READY again (the
task will run again), with an entry in ``errors`` whose class is
:class:`~delayq_transport.formats.django_tasks.TaskInterrupted`, naming the attempt, its worker,
what happened and when the task runs again; ``attempts`` (``worker_ids``) counts it:

* **given back** (SIGTERM, and a task still running when ``shutdown_timeout`` ran out; or an
  outcome that could not be written): the worker records it, READY with its entry, before it
  releases the queue row (:meth:`Attempts.give_back`);
* **killed** (SIGKILL, OOM, a lost host): nothing can be written then. Each running attempt
  carries a liveness in the database (``aliveUntil``, database clock), pushed ``alive_s``
  ahead every quarter of it (:meth:`Attempts.touch`, a job of the session's thread).
  ``get_result`` reads it with the result: a RUNNING result whose liveness lapsed is shown
  READY with the entry and the time the lease ends (when another worker takes it); the next
  worker to claim it records the entry for good (``TaskResults.start``).

Why a liveness of its own and not the queue row's lease: the lease decides when another worker
runs the task again, so it must outlast any pause of a live worker (60 s by default, extended
every third), and shortening it risks running a task twice; the liveness only decides what a
reader is told, so it can be short (``alive_s``: a quarter of the lease, at most 10 s). Not the
database session either (an advisory lock, ``pg_stat_activity``): behind PgBouncer's
transaction pooling a session outlives its client. And not at the next claim alone: that is a
lease later, and there may be no next worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..core import DatabaseError, DatabaseUnavailable, TaskResults
from ..core.ledgers import Attempt
from ..formats.django_tasks import given_back, lost

log = logging.getLogger(__name__)

#: The longest an attempt's liveness runs ahead: a killed worker's results say so this soon.
ALIVE_MAX_S = 10.0
#: The shortest (a tiny lease in tests): touches stay a few per second at most.
ALIVE_MIN_S = 1.0
#: Touches per liveness span: two may be missed (a busy database) before a reader is misled.
TOUCHES_PER_SPAN = 4


def alive_s(lease_s: float) -> float:
    """How long an attempt's liveness runs ahead of its last touch, for a backend's LEASE."""
    return max(min(lease_s / 4, ALIVE_MAX_S), ALIVE_MIN_S)


class Attempts:
    """The attempts one worker process is running (thread-safe)."""

    def __init__(self, results: TaskResults, worker_id: str, lease_s: float,
                 clock_ms: Callable[[], int]) -> None:
        self.results = results
        self.worker_id = worker_id
        self.alive_ms = int(alive_s(lease_s) * 1000)
        #: Seconds between touches (the session's job interval).
        self.touch_interval_s = alive_s(lease_s) / TOUCHES_PER_SPAN
        self._clock_ms = clock_ms
        self._running: dict[str, int] = {}  # key -> attempt number
        self._lock = threading.Lock()

    def begin(self, key: str, task_json: str, enqueued_at_ms: int | None,
              at_ms: int) -> Attempt | None:
        """Start an attempt (None: the result is final already, not to run again)."""
        attempt = self.results.start(key, task_json, enqueued_at_ms, self.worker_id, at_ms,
                                     alive_ms=self.alive_ms, lost=lost(at_ms, self.worker_id))
        if attempt is not None:
            with self._lock:
                self._running[key] = len(attempt.worker_ids)
        return attempt

    def end(self, key: str) -> None:
        """The attempt settled (or was given back): no longer touched."""
        with self._lock:
            self._running.pop(key, None)

    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def touch(self) -> int:
        """Push the liveness of every running attempt (the session's thread)."""
        return self.results.touch(self.running(), self.alive_ms)

    def give_back(self, keys: list[str], why: str, due_in_s: float = 0.0) -> None:
        """Record these attempts as given back unfinished, due again in ``due_in_s``: before
        their rows are released. A write that fails is logged: the result then reads as
        interrupted all the same (RUNNING with its row not held), and the next claim records
        it."""
        at = self._clock_ms()
        for key in keys:
            with self._lock:
                attempt = self._running.pop(key, None)
            if attempt is None:
                continue
            entry = given_back(attempt, self.worker_id, why, at, at + int(due_in_s * 1000))
            try:
                self.results.interrupt(key, attempt, entry, at)
            except (DatabaseUnavailable, DatabaseError) as exc:
                log.warning("delayq: could not record that task %s was given back: %s", key,
                            exc)
