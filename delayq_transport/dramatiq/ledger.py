"""Where Dramatiq's periodic actors are recorded: delayq_beat's ledger, in a namespace of its own.

delayq_beat's installer uninstalls every ledger entry that is not in the configuration it is
given; Celery beat and the Dramatiq scheduler share the table, so each keeps its ledger rows
under its own ``tableName`` (``<table>#dramatiq``) and never removes the other's entries. No
Dramatiq import here: ``delayq beat list`` shows these entries in any process.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from delayq_beat.cli import LIST_HOOKS, entries_table
from delayq_beat.store import BeatStore

from ..core.db import Database
from ..core.periodic import PeriodicStore
from ..core.queue import DelayedQueue

LEDGER_SUFFIX = "#dramatiq"


class DramatiqLedger(BeatStore):
    """``BeatStore`` whose rows live under ``<table>#dramatiq``."""

    def __init__(self, db: Database, table: str = "delayed_queue", *,
                 ensure_schema: bool = True) -> None:
        super().__init__(db, table, ensure_schema=ensure_schema)
        self.rows = _NamespacedRows(db, table)


class _NamespacedRows(PeriodicStore):
    """The core's entry/ledger statements, keyed by ``<table>#dramatiq``."""

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {**super()._params(**extra), "table_name": self.table + LEDGER_SUFFIX}


def periodic_table(queue: DelayedQueue, shown: int) -> Table | None:
    """The ``delayq beat list`` section of Dramatiq's periodic actors (None if there are none)."""
    store = DramatiqLedger(queue.db, queue.table, ensure_schema=False)
    if not store.installed():
        return None
    return entries_table(queue, store, shown, title="Dramatiq periodic actors (times UTC)")


if periodic_table not in LIST_HOOKS:
    LIST_HOOKS.append(periodic_table)
