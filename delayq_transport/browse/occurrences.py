"""Periodic entries' installed occurrences, folded in a task listing: one line per entry.

The scheduling engine installs an hour or more of each periodic entry ahead (Celery beat's,
Dramatiq's periodic actors, django.tasks' periodic tasks alike), each a row keyed
``<entry prefix>/<config hash>/<epoch ms>`` (``core/integrations/cron.py``): an entry every ten
seconds is 360 rows that bury the tasks a listing is for. Folded, a listing shows an entry's
next installed occurrence only (its earliest key, read from the key index once per entry and
listing) and names the entries whose later ones it left out; ``delayq tasks list
--all-occurrences`` shows them all.
"""

from __future__ import annotations

import re

from ..core.inspect import TaskRow
from ..core.integrations import CronService
from ..core.queue import DelayedQueue
from ..scheduling.entries import entry_name

#: An occurrence's key: the entry's key prefix, its 32-hex config hash, its epoch ms.
OCCURRENCE_KEY = re.compile(r"(?P<prefix>[^/]+)/(?P<hash>[0-9a-f]{32})/\d{1,20}")


def occurrence_entry(key: str) -> str | None:
    """The entry name of an occurrence's key, or None for another task."""
    found = OCCURRENCE_KEY.fullmatch(key)
    return None if found is None else entry_name(found["prefix"])


class OccurrenceFold:
    """Which rows of one listing are an entry's later occurrences (see the module)."""

    def __init__(self, queue: DelayedQueue) -> None:
        self.queue = queue
        self._first: dict[tuple[str, str, str], str | None] = {}
        #: Entries some of whose occurrences were left out.
        self.folded: set[str] = set()

    def hides(self, row: TaskRow) -> bool:
        """Whether ``row`` is an occurrence after its entry's next one."""
        found = OCCURRENCE_KEY.fullmatch(row.key)
        if found is None:
            return False
        which = (row.kind, found["prefix"], found["hash"])
        if which not in self._first:
            first = CronService(self.queue.with_kind(row.kind)).installed(
                found["prefix"], 1, config_hash=found["hash"])
            self._first[which] = first[0].key if first else None
        if self._first[which] in (None, row.key):
            return False
        self.folded.add(entry_name(found["prefix"]))
        return True
