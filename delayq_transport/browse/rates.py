"""Throughput over recent windows, from PostgreSQL's cumulative row counters.

``pg_stat_user_tables`` counts inserts and deletes since the statistics were reset, with no
history, so a rate needs two samples over time. They are kept here, in the page server's memory
(a sample at most every ``SAMPLE_EVERY_S`` seconds, an hour of them): after a restart the
windows fill again from the first request. Keeping samples in the database would survive a
restart but costs a write per refresh of every open page; not worth it for a rate display.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

#: The windows shown (seconds): what is happening now, and the trend.
WINDOWS_S = (300, 3600)
SAMPLE_EVERY_S = 5.0
#: A window needs samples at least this far apart to be shown.
MIN_SPAN_S = 1.0


class RateWindows:
    """(monotonic time, inserted, deleted) samples of the last hour; thread-safe enough for
    the page's use (appends and reads of a deque)."""

    def __init__(self) -> None:
        keep = int(max(WINDOWS_S) / SAMPLE_EVERY_S) + 2
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=keep)
        self.latest: tuple[float, int, int] | None = None

    def add(self, inserted: int, deleted: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.latest = (now, inserted, deleted)
        if not self.samples or now - self.samples[-1][0] >= SAMPLE_EVERY_S:
            self.samples.append(self.latest)

    def windows(self) -> list[dict[str, Any]]:
        """Per window: tasks done and published per second over the part of it that samples
        cover (``span_s`` says how much: less than the window after a restart)."""
        if self.latest is None:
            return []
        now, ins, dels = self.latest
        out = []
        for window in WINDOWS_S:
            # The newest sample at least a window old (else the oldest): the whole window.
            older = [s for s in self.samples if now - s[0] >= window]
            start = older[-1] if older else self.samples[0]
            if now - start[0] < MIN_SPAN_S:
                continue
            span = now - start[0]
            out.append({"window_s": window, "span_s": round(span, 1),
                        "done_per_s": max(dels - start[2], 0) / span,
                        "published_per_s": max(ins - start[1], 0) / span})
        return out
