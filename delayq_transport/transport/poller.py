"""Polling off the event loop: the thread that runs the plans channels make (:class:`PollPlan`).

A poll statement takes a millisecond or two; run on the hub it would stall everything else
the worker's loop does (feeding the pool, acks, timers). So the loop thread plans the poll
(QoS is its own), the poller thread runs the statements, and the result comes back through the
transport's wake-up socket to be delivered on the loop thread. One poll at a time: the window
it was planned for cannot shrink meanwhile, only grow as acks come in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from queue import SimpleQueue

from .ports import PollPlan

__all__ = ["PollJob", "PollPlan", "Poller", "fetch_all"]


#: A poll handed to the poller thread: its outcome (an error or None) and what it fills in.
PollJob = tuple[Future[Exception | None], list[PollPlan]]


def fetch_all(plans: list[PollPlan]) -> Exception | None:
    """Run the plans' statements. An error stops the pass but is returned, not raised, so what
    the earlier plans took is still delivered rather than left to its lease."""
    for plan in plans:
        try:
            plan.channel.fetch(plan)
        except Exception as exc:
            return exc
    return None


class Poller:
    """The ``delayq-poller`` thread: runs one submitted poll at a time, then calls ``done``
    (which wakes the event loop) so the loop thread delivers."""

    def __init__(self, done: Callable[[], None]) -> None:
        self._done = done
        self._jobs: SimpleQueue[PollJob | None] = SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, plans: list[PollPlan]) -> Future[Exception | None]:
        future: Future[Exception | None] = Future()
        if self._thread is None or not self._thread.is_alive():
            self._jobs = SimpleQueue()  # a stopped poller's queue may hold its stop mark
            self._thread = threading.Thread(target=self._run, args=(self._jobs,),
                                            name="delayq-poller", daemon=True)
            self._thread.start()
        self._jobs.put((future, plans))
        return future

    def _run(self, jobs: SimpleQueue[PollJob | None]) -> None:
        while (job := jobs.get()) is not None:
            future, plans = job
            future.set_result(fetch_all(plans))
            self._done()

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
