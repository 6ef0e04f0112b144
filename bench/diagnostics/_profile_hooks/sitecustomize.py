"""Counters inside a profiled worker (``profile_celery.py --e2e``), loaded as ``sitecustomize``.

Only active when ``DELAYQ_PROFILE_COUNTS`` names a file: then the transport's wake-up and poll
paths are wrapped to count what they do, and the counts are written to that file twice a
second (the worker is killed, not stopped, at the end of a phase). Nothing else is changed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from typing import Any

_PATH = os.environ.get("DELAYQ_PROFILE_COUNTS")


def _install(path: str) -> None:
    from delayq_transport.core.queue import Listener, Session

    counts: Counter[str] = Counter()
    pid = os.getpid()

    def wrap(cls: Any, name: str, after: Any) -> None:
        original = getattr(cls, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if os.getpid() == pid:
                after(self, args, result)
            return result

        setattr(cls, name, wrapper)

    def timed(cls: Any, name: str) -> None:
        original = getattr(cls, name)
        label = f"cpu_us:step:{cls.__name__}.{name}"

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return original(self, *args, **kwargs)
            finally:
                counts[label] += int((time.thread_time() - t0) * 1e6)

        setattr(cls, name, wrapper)

    def drained(_: Any, __: Any, notes: Any) -> None:
        counts["listen_drains"] += 1
        counts["notifies_received"] += len(notes)
        counts["listen_drains_with_notes"] += bool(notes)

    def ticked(self: Any, _: Any, __: Any) -> None:
        counts["loop_ticks"] += 1

    def started(self: Any, args: Any, __: Any) -> None:
        counts["polls"] += 1
        counts["rows_wanted"] += sum(want for _, want in args[0])

    def delivered(self: Any, args: Any, result: Any) -> None:
        counts["polls_delivered"] += 1
        counts["rows_delivered"] += int(result or 0)
        counts["empty_polls"] += not result

    wrap(Listener, "drain", drained)
    wrap(Session, "_on_tick", ticked)
    wrap(Session, "_run_plans", started)
    wrap(Session, "_deliver", delivered)
    from delayq_transport.transport.channel import DelayqChannel

    for cls, name in ((Session, "drain"), (Session, "_on_tick"), (Session, "_on_kick"),
                      (Session, "fetch"), (DelayqChannel, "deliver"), (Session, "flush")):
        timed(cls, name)

    def thread_cpu() -> None:
        import psutil

        names = {t.native_id: t.name for t in threading.enumerate()}
        per_thread: Counter[str] = Counter()
        for t in psutil.Process().threads():
            per_thread[f"cpu_us:thread:{names.get(t.id, 'other')}"] += int(
                (t.user_time + t.system_time) * 1e6)
        for key, value in per_thread.items():  # totals so far, not increments
            counts[key] = value

    def dump() -> None:
        while True:
            time.sleep(0.5)
            if os.getpid() != pid:
                return
            thread_cpu()
            tmp = f"{path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(dict(counts), fh)
            os.replace(tmp, path)

    threading.Thread(target=dump, name="profile-counts", daemon=True).start()


if _PATH:
    _install(_PATH)
