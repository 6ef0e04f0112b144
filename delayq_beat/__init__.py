"""delayq_beat: a Celery beat scheduler that installs occurrences into delayed_queue ahead of time.

``celery -A proj beat -S delayq_beat.Scheduler`` (or ``-S delayq`` through the
``celery.beat_schedulers`` entry point). A front end of the scheduling engine
(:mod:`delayq_transport.scheduling`): the Celery ``Scheduler`` (:mod:`.scheduler`), the
translation of Celery's schedules (:mod:`.entries`), Celery's messages and routes
(:mod:`.installer`), DB-backed entries (:mod:`.store`) and ``delayq beat ...`` (:mod:`.cli`).
See docs/how-to/beat.md.
"""

from __future__ import annotations

from delayq_transport.scheduling.misfire import drop_misfired

from .entries import EntrySpec, make_spec, occurrences
from .installer import Installer, RefreshReport, Route, Settings, occurrence_task_id
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
