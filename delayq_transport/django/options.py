"""The ``OPTIONS`` of the ``django.tasks`` backend (``TASKS[alias]["OPTIONS"]``), declared once.

:data:`TASK_OPTIONS` gives each option its default, what its value must be and its meaning:
:class:`~.backend.DelayqBackend` reads its ``OPTIONS`` through it (:meth:`Options.parse`: an
unknown name or a value of the wrong type or range is refused, never converted), and
``docs/reference/django-tasks-options.md`` is rendered from it (``python
docs/_gen/reference.py``). It imports neither ``django.tasks`` nor settings, so the reference
renders under any Django.
"""

from __future__ import annotations

from typing import Any

from ..core.queue import (
    IS_FLAG,
    IS_MAPPING,
    IS_NAME,
    IS_TABLE,
    Check,
    Option,
    Options,
    optional,
    seconds,
    whole,
)
from ..core.schema import DEFAULT_SCHEMA_WAIT_S
from ..formats.deadletters import DEFAULT_RETENTION_S

DEFAULT_RESULT_RETENTION_S = 7 * 86400.0
DEAD_LETTER_RETENTION_S = DEFAULT_RETENTION_S
#: ``OPTIONS["PERIODIC_SOURCE"]``: where a backend's periodic tasks come from.
PERIODIC_SOURCES = ("settings", "admin", "both")
IS_PERIODIC_SOURCE = Check(f"one of {', '.join(map(repr, PERIODIC_SOURCES))}",
                           lambda v: isinstance(v, str) and v in PERIODIC_SOURCES)


def option(name: str, default: Any, check: Check, doc: str, shown: str | None = None) -> Option:
    """An option whose reference "unit" is what its check expects: one sentence serves the
    error and the page."""
    return Option(name, default, check.expects, doc, shown=shown, check=check)


TASK_OPTIONS = Options(
    option("DATABASE", "default", IS_NAME,
           "The `DATABASES` alias whose PostgreSQL database holds the queue table (a system "
           "check, `delayq.E001`/`E002`, says when it is missing or not PostgreSQL)."),
    option("TABLE", "delayed_queue", IS_TABLE,
           "The queue table, shared with Celery's and Dramatiq's when they use the same one; "
           "the task results live in `delayq_task_results`."),
    option("JOIN_ATOMIC", True, IS_FLAG,
           "Inside an `atomic()` block on `DATABASE`, enqueue writes the task's row in that "
           "transaction: a worker sees it once the block commits, never if it rolls back. "
           "False: the row commits at once, even inside a block."),
    option("RETRIES", 0, whole(0),
           "How many more times a failed task runs (per task: `@retry`)."),
    option("BACKOFF", 1.0, seconds(),
           "Seconds before the first retry, doubled each time (per task: `@retry(backoff=)`)."),
    option("MAX_BACKOFF", 3600.0, seconds(),
           "The longest wait between two attempts, whatever the doubling reaches."),
    option("LEASE", 60.0, seconds(positive=True),
           "How long a running task's row is held between the worker's extensions (every "
           "third of it): a killed worker's task runs again this long after it died (its "
           "result reads interrupted within a quarter of it, at most 10 s)."),
    option("RESULT_RETENTION", DEFAULT_RESULT_RETENTION_S,
           optional(seconds(), "kept forever"),
           "How long a finished task's result stays readable (`get_result`); the workers "
           "delete older ones.", shown="604800.0 (7 days)"),
    option("DEAD_LETTER_RETENTION", DEAD_LETTER_RETENTION_S, seconds(),
           "How long a row the worker cannot read as a task is kept as a [dead letter]"
           "(../how-to/manage-tasks.md#dead-letters).",
           shown="604800.0 (7 days)"),
    option("SCHEMA_WAIT", DEFAULT_SCHEMA_WAIT_S, seconds(),
           "How long `manage.py delayq_worker` waits for delayq's tables before it exits ([a "
           "worker before `delayq migrate`](../how-to/upgrade.md#a-worker-before-delayq-migrate)"
           "); 0 exits at once."),
    option("POLLING_INTERVAL", 5.0, seconds(positive=True),
           "A worker's fallback poll: it is woken by LISTEN/NOTIFY for new due tasks and by a "
           "timer for the earliest known due time; this poll only covers a missed "
           "notification."),
    option("POOL_SIZE", 8, whole(1),
           "Most connections of the process' pool, shared by every backend instance (Django "
           "makes one per thread) on the same database and table."),
    option("PERIODIC", {}, IS_MAPPING,
           "Periodic tasks by name, installed ahead by the workers' schedulers (each "
           "occurrence runs once); each entry is checked by `manage.py check` "
           "(`delayq.E005`). See [periodic tasks](../how-to/django-tasks.md#periodic-tasks).",
           shown="none"),
    option("PERIODIC_SOURCE", "settings", IS_PERIODIC_SOURCE,
           "Where periodic tasks come from: `settings` (`PERIODIC`), `admin` "
           "(django-celery-beat's rows whose `task` is one of this backend's tasks) or `both` "
           "(a row overrides an entry of the same name). See [periodic tasks from the "
           "admin](../how-to/django-tasks.md#periodic-tasks-from-the-admin)."),
    option("PERIODIC_REFRESH", 60.0, seconds(positive=True),
           "Seconds between a worker's refreshes of the periodic tasks: an admin edit takes "
           "effect within one."),
)
