"""Where a Django project keeps delayq's tables, from its settings: what the admin app
(:mod:`.admin`) shows and the ``manage.py`` commands (``delayq_migrate``, ``delayq_prune``,
``delayq_health``) work on, without a URL built by hand.

A :class:`Target` is a ``DATABASES`` alias and a queue table, read from:

* a ``TASKS`` backend of delayq's (``--backend ALIAS``): its ``OPTIONS`` ``DATABASE`` and
  ``TABLE`` (and its ``QUEUES``, ``RESULT_RETENTION``), parsed by the backend's own option
  registry, so a wrong value is the error the backend gives;
* else ``DELAYQ_DATABASE`` (default ``"default"``, the alias Celery's ``DELAYQ_JOIN_ATOMIC``
  joins) and ``DELAYQ_TABLE`` (default ``"delayed_queue"``): a Celery or Dramatiq project
  without ``django.tasks``.

With no alias given, the ``TASKS`` backend ``"default"`` when it is delayq's, else the first
of delayq's, else the second way. Django's task framework is never imported here: a Celery
project on a Django without it uses the same commands and admin.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ..core import Database, DelayedQueue, InvalidInput, validate_table_name
from . import database_url
from .apps import delayq_task_aliases
from .options import TASK_OPTIONS

#: Connections of the pool the admin and the commands share per process and table (pages
#: read one statement at a time).
POOL_SIZE = 4


@dataclass(frozen=True)
class Target:
    """A ``DATABASES`` alias and a queue table (see the module docstring)."""

    database: str
    table: str
    #: The ``TASKS`` alias it comes from (None: ``DELAYQ_DATABASE``/``DELAYQ_TABLE``).
    backend: str | None = None
    #: The backend's ``OPTIONS``, parsed (the defaults when there is no backend).
    options: dict[str, Any] = field(default_factory=dict)
    #: The backend's ``QUEUES`` (empty: any queue).
    queues: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"TASKS[{self.backend!r}]" if self.backend else \
            f"DELAYQ_DATABASE {self.database!r}"

    def url(self) -> str:
        """The libpq URL of the alias; ``ImproperlyConfigured`` naming what is wrong."""
        try:
            return database_url(self.database)
        except InvalidInput as exc:
            raise ImproperlyConfigured(f"{self.where}: {exc}") from None

    def queue(self) -> DelayedQueue:
        """The process' queue of this target (one pool per URL and table, see :func:`queue_for`)."""
        return queue_for(self.url(), self.table)


def target(backend: str | None = None, *, database: str | None = None,
           table: str | None = None) -> Target:
    """The target of a ``TASKS`` alias, or of ``database``/``table`` given, or the default
    (the module docstring). ``ImproperlyConfigured`` names a wrong alias or option."""
    if backend is not None and (database is not None or table is not None):
        raise ImproperlyConfigured("give a TASKS backend or a database and table, not both")
    aliases = delayq_task_aliases()
    if backend is None and database is None and table is None and aliases:
        backend = "default" if "default" in aliases else aliases[0]
    if backend is not None:
        return _of_backend(backend, aliases)
    name = str(table or getattr(settings, "DELAYQ_TABLE", "delayed_queue"))
    try:
        validate_table_name(name)
    except InvalidInput as exc:
        raise ImproperlyConfigured(f"delayq's table: {exc}") from None
    alias = str(database or getattr(settings, "DELAYQ_DATABASE", "default"))
    return Target(alias, name, options=TASK_OPTIONS.parse({}, "defaults"))


def _of_backend(alias: str, aliases: list[str]) -> Target:
    if alias not in aliases:
        known = ", ".join(map(repr, aliases)) or "none"
        raise ImproperlyConfigured(f"TASKS[{alias!r}] is not a delayq backend (delayq's: "
                                   f"{known})")
    entry = settings.TASKS[alias]
    try:
        options = TASK_OPTIONS.parse(entry.get("OPTIONS") or {}, f"TASKS[{alias!r}] OPTIONS")
    except InvalidInput as exc:
        raise ImproperlyConfigured(str(exc)) from None
    return Target(options["DATABASE"], options["TABLE"], alias, options,
                  tuple(entry.get("QUEUES") or ()))


_QUEUES: dict[tuple[str, str], tuple[int, DelayedQueue]] = {}
_LOCK = threading.Lock()


def queue_for(url: str, table: str) -> DelayedQueue:
    """One queue (and pool, at most :data:`POOL_SIZE` connections, none held while idle) per
    URL and table in this process, made on first use; a forked child makes its own. It never
    creates tables: a page or a command that only reads must not (``delayq_migrate`` does)."""
    key = (url, table)
    with _LOCK:
        made = _QUEUES.get(key)
        if made is not None and made[0] == os.getpid():
            return made[1]
        db = Database(url, min_size=0, max_size=POOL_SIZE)
        try:
            queue = DelayedQueue(db, kind="celery", table=table, ensure_schema=False)
        except BaseException:
            db.close()
            raise
        _QUEUES[key] = (os.getpid(), queue)
        return queue


def close_queues() -> None:
    """Close the pools this process made (tests, and commands on their way out)."""
    with _LOCK:
        made = [q for pid, q in _QUEUES.values() if pid == os.getpid()]
        _QUEUES.clear()
    for queue in made:
        queue.close()
        queue.db.close()
