"""Which kinds hold a queue's tasks, whatever front end wrote them: what ``delayq tasks list
-Q NAME`` and the page's queue filter select.

A queue is split into kinds by priority, differently per front end: Celery ``mail``,
``mail\\x06\\x163``... (:mod:`.celery`), Dramatiq ``dramatiq:mail``, ``dramatiq:mail:p1``...
(:mod:`.dramatiq`), Django's task framework ``django:mail:-100`` to ``django:mail:100``
(:mod:`.django_tasks`). A name selects every task kind of that queue in all three, or of one
front end when qualified (``dramatiq:mail``, ``django:mail``); dead letters are not the
queue's tasks (``delayq tasks dead-letters`` lists them). A name that is a kind selects it too.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import celery, dramatiq
from .django_tasks import KIND_PREFIX as DJANGO_PREFIX


def _django_queue(kind: str) -> str | None:
    if not kind.startswith(DJANGO_PREFIX):
        return None
    queue, sep, priority = kind[len(DJANGO_PREFIX):].rpartition(":")
    return queue if sep and priority.lstrip("-").isdigit() else None


def queue_names(kind: str) -> set[str]:
    """The names that select ``kind`` as one of a queue's task kinds (empty: a dead letter)."""
    found = dramatiq.queue_of_kind(kind)
    if found is not None:
        queue, _, dead = found
        return set() if dead else {queue, f"{dramatiq.NAMESPACE}:{queue}"}
    django = _django_queue(kind)
    if django is not None:
        return {django, f"{DJANGO_PREFIX}{django}"}
    return {celery.queue_of_kind(kind)[0]}


#: The one name under which a task carries its limit key (docs/how-to/limits.md).
LIMIT_KEY = "delayq_limit_key"


def limit_key_path(kind: str) -> str | None:
    """Where a task of ``kind`` carries its limit key in its payload's JSON (a dotted path the
    claim of a controlled queue reads): a Celery message header, a Dramatiq message option, a
    django.tasks keyword argument. None for dead letters."""
    if dramatiq.queue_of_kind(kind) is not None:
        return None if not queue_names(kind) else f"options.{LIMIT_KEY}"
    if _django_queue(kind) is not None:
        return f"kwargs.{LIMIT_KEY}"
    return f"headers.{LIMIT_KEY}"


def kinds_of_queue(name: str, kinds: Iterable[str]) -> list[str]:
    """Of ``kinds``, those holding tasks of the queue ``name`` (or that are ``name``)."""
    return [k for k in kinds if k == name or name in queue_names(k)]
