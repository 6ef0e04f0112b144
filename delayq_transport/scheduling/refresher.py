"""The refresh loop every in-process scheduler runs (django.tasks' and Dramatiq's periodic
tasks): refresh, wait an interval, again, until stopped.

Written once so both front ends fail alike: a refresh that raises (the database down, a bug in
one pass) is logged with its traceback and tried again after the interval; the thread never
dies of it, since installed occurrences run anyway and the next refresh catches up. A stop
wakes the wait at once, so a worker's shutdown is not held up by a refresh interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class RefreshThread:
    """Calls ``refresh`` every ``interval`` seconds on a daemon thread named ``name``
    (:meth:`start`), or on the caller's thread (:meth:`run`), until :meth:`stop`. ``what`` names
    the scheduler in the log line of a failed refresh."""

    def __init__(self, refresh: Callable[[], object], interval: float, *, name: str,
                 what: str) -> None:
        if interval <= 0:
            raise ValueError(f"refresh interval must be positive, got {interval!r}")
        self.refresh = refresh
        self.interval = float(interval)
        self.name = name
        self.what = what
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Refresh until :meth:`stop`; a failed refresh is logged and tried again."""
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:
                log.exception("%s: refresh failed; again in %.0f s", self.what, self.interval)
            self._stop.wait(self.interval)

    def start(self) -> RefreshThread:
        """Run on a daemon thread of this process (again after a :meth:`stop`)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop; wait up to ``timeout`` for a refresh under way to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
