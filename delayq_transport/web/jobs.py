"""Bulk actions on large selections, in the background (issue 38's decision, option b).

A cancel, reschedule or run-now of many rows is a write proportional to what it changes (a
cancel ~20 µs a row: 0.7 s for a 10-minute bar of 35,000 rows at 5M rows, ~20 s at the
1,000,000-row cap; a reschedule ~10 times that), so no request could promise a time for it.
Above :data:`BACKGROUND_ROWS` the POST starts a :class:`BulkJob` in a thread of the ``delayq
web`` process and answers at once with its id; the page then polls
``GET /api/tasks/bulk/jobs/{id}`` (memory only, no database) and shows the progress and the
outcome. The work itself is :mod:`delayq_transport.browse.bulk`'s, in batches each its own short
transaction, as for a small selection.

Jobs live in the process' memory only: a restart of ``delayq web`` forgets them, and one
stopped mid-way (the process ended) has applied the batches it committed and no other; run
the action again for the rest (rows already changed no longer match, or are counted as gone).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..browse import TaskNotFound
from ..browse.bulk import BulkResult
from ..core import DelayqError, InvalidInput

log = logging.getLogger(__name__)

#: Selections larger than this run in the background (the page's confirmation and the API
#: alike); smaller ones answer in their request (≤ ~100 ms of cancels at ~20 µs a row).
BACKGROUND_ROWS = 5_000
#: Background actions running at once per process; more are refused until one ends.
MAX_RUNNING = 2
#: Finished jobs remembered (their status stays readable), oldest forgotten first.
KEPT = 100


class JobNotFound(TaskNotFound):
    """No bulk action of that id in this process (unknown, forgotten, or the server restarted)."""


@dataclass
class BulkJob:
    """One background bulk action; its fields are written by its thread only."""

    id: str
    action: str
    #: The count its confirmation showed (exact, or an estimate above the preview's cap).
    expected: int
    state: str = "collecting"  # then "applying", then "done" or "failed"
    collected: int = 0
    result: BulkResult | None = None
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    #: When the targets were collected and the writes began.
    applying_at: float | None = None
    finished_at: float | None = None

    def applying(self, collected: int) -> None:
        self.collected, self.applying_at, self.state = collected, time.time(), "applying"

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    def as_dict(self) -> dict[str, Any]:
        result = self.result
        total = result.matched if result is not None else self.collected
        processed = result.processed if result is not None else 0
        detail = self.error if self.error else (result.detail if result is not None else
                                                f"collecting the matching tasks: "
                                                f"{self.collected:,} so far")
        if self.state == "failed" and result is not None:
            detail = f"{result.detail}; then failed: {self.error}"
        return {
            "id": self.id, "action": self.action, "state": self.state,
            "finished": self.finished, "expected": self.expected, "collected": self.collected,
            "total": total, "processed": processed,
            "percent": 100 if self.state == "done" else
            (min(99, processed * 100 // total) if total else 0),
            "result": result.as_dict() if result is not None else None,
            "error": self.error, "detail": detail,
            "started_at": self.started_at, "applying_at": self.applying_at,
            "finished_at": self.finished_at,
            "status_url": f"/api/tasks/bulk/jobs/{self.id}",
            "page_url": f"/tasks/bulk/jobs/{self.id}",
        }


class BulkJobs:
    """The background bulk actions of one ``delayq web`` process."""

    def __init__(self) -> None:
        self._jobs: OrderedDict[str, BulkJob] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, action: str, expected: int,
              work: Callable[[BulkJob], BulkResult]) -> BulkJob:
        """Run ``work`` in a thread; it reports through the job it is given."""
        with self._lock:
            running = [j for j in self._jobs.values() if not j.finished]
            if len(running) >= MAX_RUNNING:
                raise InvalidInput(
                    f"{len(running)} bulk actions are running already (at most {MAX_RUNNING} "
                    f"at once): wait for one to end, e.g. /tasks/bulk/jobs/{running[0].id}")
            job = BulkJob(secrets.token_urlsafe(12), action, expected)
            self._jobs[job.id] = job
            finished = [k for k, j in self._jobs.items() if j.finished]
            for key in finished[:max(0, len(self._jobs) - KEPT)]:
                del self._jobs[key]
        threading.Thread(target=self._run, args=(job, work), name=f"delayq-bulk-{job.id}",
                         daemon=True).start()
        return job

    @staticmethod
    def _run(job: BulkJob, work: Callable[[BulkJob], BulkResult]) -> None:
        try:
            job.result = work(job)
            job.state = "done"
        except DelayqError as exc:
            job.error, job.state = str(exc), "failed"
        except Exception as exc:  # noqa: BLE001 - reported on the job's page, and logged
            log.exception("delayq web: bulk action %s failed", job.id)
            job.error, job.state = f"{type(exc).__name__}: {exc}", "failed"
        finally:
            job.finished_at = time.time()

    def get(self, job_id: str) -> BulkJob:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFound(f"no bulk action {job_id[:40]!r} in this server: jobs live in "
                              "its memory only (a restart forgets them)")
        return job
