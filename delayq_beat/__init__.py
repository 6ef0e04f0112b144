"""delayq_beat: a Celery beat scheduler that installs occurrences into delayed_queue ahead of time.

``celery -A proj beat -S delayq_beat.Scheduler`` (or ``-S delayq`` through the
``celery.beat_schedulers`` entry point). Its two tables come with the core's migration 10
(``delayq migrate``, or the first open of the queue). See docs/how-to/beat.md.
"""

from __future__ import annotations

from .entries import EntrySpec, make_spec, occurrences
from .installer import Installer, RefreshReport, Route, Settings, occurrence_task_id
from .misfire import drop_misfired
from .scheduler import Scheduler
from .store import BeatStore

__all__ = [
    "BeatStore",
    "EntrySpec",
    "Installer",
    "RefreshReport",
    "Route",
    "Scheduler",
    "Settings",
    "drop_misfired",
    "make_spec",
    "occurrence_task_id",
    "occurrences",
]
