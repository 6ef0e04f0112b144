"""The system checks of delayq's Django integration (``manage.py check``; ``migrate`` runs them
first), in one place. Codes are stable; docs/how-to/django-tasks.md lists them.

* :func:`backend_checks`: one ``django.tasks`` backend (``DelayqBackend.check()``, which
  Django's task framework calls for every backend in ``TASKS``): its OPTIONS (``E007``), its
  database (``E001``/``E002``), ``DELAYQ_JOIN_ATOMIC`` (``E003``), its queue names
  (``E004``), the app (``W001``), its periodic tasks (``E005``, admin mode ``W004``-``W007``)
  and its table (``W002``/``W003``);
* :func:`task_framework_check`: registered by the app: which task framework runs those checks
  at all (``E006``, ``W008``).

Django makes every backend before it asks for its checks, so a backend whose OPTIONS are
refused is still made (in a refused state: every use raises ``ImproperlyConfigured``, see
``DelayqBackend``), and its problems reach the report here instead of as a traceback.

Nothing here imports the backend module: it imports this one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from django.apps import AppConfig, apps
from django.conf import settings
from django.core import checks

from ..core import DatabaseUnavailable, DelayqError, SchemaMissing, require_schema
from ..core.db import Database
from ..formats.django_tasks import MAX_QUEUE_NAME
from . import FrameworkMissing

#: The hint of every ``delayq.E007`` (a refused OPTIONS name or value).
OPTIONS_HINT = "see docs/reference/django-tasks-options.md for each option and its values"


class CheckedBackend(Protocol):
    """What the checks read of a ``DelayqBackend``."""

    alias: str
    database: str
    table: str
    queues: set[str]
    periodic: dict[str, Any]
    periodic_source: str
    option_problems: list[str]

    def database_handle(self) -> Database: ...


def backend_checks(backend: CheckedBackend) -> Iterator[checks.CheckMessage]:
    """Every check of one backend, in the order of the module docstring."""
    where = f"TASKS[{backend.alias!r}]"
    if backend.option_problems:
        for problem in backend.option_problems:
            yield checks.Error(problem, hint=OPTIONS_HINT, id="delayq.E007")
        return  # the rest reads options that were refused
    database = database_error(where, backend.database)
    if database is not None:
        yield database
        return
    yield from _settings_checks(backend, where)
    yield from _check_schema(backend, where)
    yield from _check_admin(backend, where)


def database_error(where: str, alias: str) -> checks.Error | None:
    """``delayq.E001``/``E002`` for the backend's ``DATABASE``, or None: the check's message,
    and the ``ImproperlyConfigured`` a backend raises when it is used all the same."""
    databases = settings.DATABASES
    if alias not in databases:
        return checks.Error(
            f"{where}: OPTIONS DATABASE = {alias!r} is not in DATABASES (have: "
            f"{', '.join(sorted(databases)) or 'none'})",
            hint="name the DATABASES alias whose database holds delayq's table",
            id="delayq.E001")
    engine = str(databases[alias].get("ENGINE", ""))
    if "postgresql" not in engine and "postgis" not in engine:
        return checks.Error(
            f"{where}: DATABASES[{alias!r}] uses {engine or 'no ENGINE'}; delayq keeps tasks "
            "in PostgreSQL", hint="point OPTIONS DATABASE at a PostgreSQL alias "
            "(django.db.backends.postgresql)", id="delayq.E002")
    return None


def _settings_checks(backend: CheckedBackend, where: str) -> Iterator[checks.CheckMessage]:
    joined = getattr(settings, "DELAYQ_DATABASE", "default")
    if getattr(settings, "DELAYQ_JOIN_ATOMIC", False) and joined != backend.database:
        yield checks.Error(
            f"{where}: DELAYQ_JOIN_ATOMIC joins the atomic() blocks of {joined!r} "
            f"(DELAYQ_DATABASE) but this backend's table is in {backend.database!r}: a task "
            "enqueued in such a block would be refused (another database)",
            hint="set DELAYQ_DATABASE to the backend's DATABASE, or turn "
            "DELAYQ_JOIN_ATOMIC off (the backend joins its own database's atomic())",
            id="delayq.E003")
    for name in sorted(backend.queues):
        if len(name) > MAX_QUEUE_NAME:
            yield checks.Error(f"{where}: queue name {name[:40]!r}... is longer than "
                               f"{MAX_QUEUE_NAME} characters", id="delayq.E004")
    if "delayq_transport.django" not in settings.INSTALLED_APPS:
        yield checks.Warning(
            f"{where}: 'delayq_transport.django' is not in INSTALLED_APPS, so "
            "`manage.py delayq_worker` is not available",
            hint="add 'delayq_transport.django' to INSTALLED_APPS", id="delayq.W001")
    if backend.periodic:
        from .periodic import entry_specs

        for name, spec in entry_specs(backend.periodic).items():
            if isinstance(spec, Exception):
                yield checks.Error(f"{where}: OPTIONS PERIODIC {name!r}: {spec}",
                                   id="delayq.E005")


def _check_admin(backend: CheckedBackend, where: str) -> Iterator[checks.CheckMessage]:
    """Admin mode: the source option, and django-celery-beat's rows as a worker would
    install them. Warnings only: rows are data an admin edits, and ``migrate`` (which runs
    the checks) must not be stopped by one."""
    source = backend.periodic_source  # one of PERIODIC_SOURCES: checked when made
    if source == "settings":
        return
    if source == "admin" and backend.periodic:
        yield checks.Warning(
            f"{where}: OPTIONS PERIODIC is not installed with PERIODIC_SOURCE 'admin'",
            hint="set PERIODIC_SOURCE to 'both' to install both, or remove PERIODIC",
            id="delayq.W004")
    yield from _check_admin_rows(backend, where)


def _check_admin_rows(backend: CheckedBackend, where: str) -> Iterator[checks.CheckMessage]:
    from ..scheduling.djbeat import DjangoBeatSource
    from .periodic_admin import classify

    try:
        source = DjangoBeatSource(backend.database_handle(), backend.table)
        if not source.tables.present():
            yield checks.Warning(
                f"{where}: PERIODIC_SOURCE {backend.periodic_source!r} reads "
                "django-celery-beat's tables, which are not in DATABASES"
                f"[{backend.database!r}]", hint="add 'django_celery_beat' to INSTALLED_APPS "
                "and run `manage.py migrate`", id="delayq.W005")
            return
        ours, skipped = classify(source, backend.alias)
    except (DatabaseUnavailable, DelayqError) as exc:
        yield checks.Warning(f"{where}: cannot read django-celery-beat's tables in "
                             f"DATABASES[{backend.database!r}]: {exc}", id="delayq.W005")
        return
    for _, row in sorted(skipped.items()):
        if not row.foreign:
            yield checks.Warning(f"{where}: {row}", id="delayq.W006")
    for name, spec in sorted(ours.items()):
        if isinstance(spec, Exception):
            yield checks.Warning(f"{where}: django-celery-beat periodic task {name!r} is "
                                 f"not installed: {spec}", id="delayq.W007")


def _check_schema(backend: CheckedBackend, where: str) -> Iterator[checks.CheckMessage]:
    """The table, read-only. A warning, not an error: ``manage.py migrate`` runs the checks
    first, and delayq's tables are made by ``delayq migrate`` or the worker, not by it."""
    try:
        require_schema(backend.database_handle(), backend.table)
    except SchemaMissing as exc:
        yield checks.Warning(
            f"{where}: {exc}", hint="run `manage.py delayq_migrate` (or start "
            "`manage.py delayq_worker`, which creates the tables): enqueue fails until then",
            id="delayq.W002")
    except (DatabaseUnavailable, DelayqError) as exc:
        yield checks.Warning(f"{where}: cannot check delayq's table in DATABASES"
                             f"[{backend.database!r}]: {exc}", id="delayq.W003")


def delayq_task_aliases() -> list[str]:
    """The ``TASKS`` aliases whose backend is delayq's."""
    tasks = getattr(settings, "TASKS", None) or {}
    return sorted(alias for alias, entry in tasks.items()
                  if str(entry.get("BACKEND", "")).startswith("delayq_transport.django."))


def task_framework_check(app_configs: Sequence[AppConfig] | None = None,
                         **kwargs: Any) -> list[checks.CheckMessage]:
    """``delayq.E006``/``W008`` (see delayq_transport/django/apps.py). Imports the framework
    only when ``TASKS`` names delayq's backend: a Celery project on Django 5.2 needs
    neither."""
    aliases = delayq_task_aliases()
    if not aliases:
        return []
    where = ", ".join(f"TASKS[{alias!r}]" for alias in aliases)
    try:
        from ._framework import BACKPORT
    except FrameworkMissing as exc:
        return [checks.Error(f"{where}: {exc}", id="delayq.E006")]
    if BACKPORT and not apps.is_installed("django_tasks"):
        return [checks.Warning(
            f"{where}: the django-tasks backport runs the task backends' checks only with its "
            "app installed: delayq's (its database, queues, periodic tasks) do not run",
            hint="add 'django_tasks' to INSTALLED_APPS", id="delayq.W008")]
    return []
