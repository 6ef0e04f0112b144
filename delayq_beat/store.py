"""Celery beat's DB-backed entries and ledger: the scheduling engine's
:class:`~delayq_transport.scheduling.store.EntryStore` (no namespace: Celery beat's rows are
keyed by the table name alone), taking Celery's schedule objects too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from delayq_transport.scheduling.store import (
    SCHEDULE_MIGRATION_VERSION,
    EntryStore,
    InstalledEntry,
    StoredEntry,
)

from .entries import EntrySpec, from_celery, own_zone

__all__ = ["BEAT_MIGRATION_VERSION", "BeatStore", "InstalledEntry", "StoredEntry"]

#: Celery beat's name for the engine's :data:`SCHEDULE_MIGRATION_VERSION`: the migration after
#: which its tables are as this release reads them.
BEAT_MIGRATION_VERSION = SCHEDULE_MIGRATION_VERSION


class BeatStore(EntryStore):
    """Python API of DB-backed entries; changes are picked up by every beat within one refresh."""

    def add(self, name: str, task: str, schedule: object, args: Sequence[Any] = (),
            kwargs: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
            *, enabled: bool = True) -> EntrySpec:
        zone = own_zone(schedule)  # a crontab's own zone is the entry's: stored as delayq_tz
        if zone is not None and "delayq_tz" not in (options or {}):
            options = {**(options or {}), "delayq_tz": zone}
        return super().add(name, task, from_celery(schedule), args, kwargs, options,
                           enabled=enabled)
