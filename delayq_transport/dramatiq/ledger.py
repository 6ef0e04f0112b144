"""Where Dramatiq's periodic actors are recorded: the scheduling engine's ledger, in a namespace
of its own.

An installer uninstalls every ledger entry that is not in the configuration it is given; Celery
beat and the Dramatiq scheduler share the table, so each keeps its ledger rows under its own
``tableName`` (``<table>#dramatiq``) and never removes the other's entries. No Dramatiq import
here: importing it makes ``delayq beat list`` show these entries in any process (the CLI loads
it with the ``beat`` command).
"""

from __future__ import annotations

from ..core.db import Database
from ..formats.dramatiq import PERIODIC_NAMESPACE, PERIODIC_TITLE
from ..scheduling.listing import register_ledger
from ..scheduling.store import EntryStore

NAMESPACE = PERIODIC_NAMESPACE
#: What the ledger's ``tableName`` ends with.
LEDGER_SUFFIX = "#" + NAMESPACE


class DramatiqLedger(EntryStore):
    """The engine's ``EntryStore`` whose rows live under ``<table>#dramatiq``."""

    def __init__(self, db: Database, table: str = "delayed_queue", *,
                 ensure_schema: bool = True) -> None:
        super().__init__(db, table, namespace=NAMESPACE, ensure_schema=ensure_schema)


register_ledger(NAMESPACE, PERIODIC_TITLE)
