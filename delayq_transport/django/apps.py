"""The Django app (``INSTALLED_APPS += ["delayq_transport.django"]``): with
``DELAYQ_JOIN_ATOMIC = True``, a task published inside ``transaction.atomic()`` on the broker's
database is written in that transaction.

Settings (read once, when Django loads its apps):

* ``DELAYQ_JOIN_ATOMIC`` (default False): opt in. Then every publish made while the
  ``DELAYQ_DATABASE`` connection of the publishing thread is inside an ``atomic()`` block joins
  that block's transaction (a rolled-back inner block drops the tasks published in it), and
  every publish outside one goes through delayq's own connection as before. A publish that
  joins is refused (never sent separately) when that database is not the broker's.
* ``DELAYQ_DATABASE`` (default ``"default"``): the alias whose ``atomic()`` blocks are joined.

With ``TASKS`` naming delayq's backend, the app imports Django's task framework when Django
loads it: Django 6 registers the task backends' system checks (``delayq.E001``...) when
``django.tasks`` is first imported, and nothing in Django imports it, so ``manage.py check``
would skip them in a project whose apps import no task module as they load. The
django-tasks backport registers them from its own app, ``django_tasks``: the app's check
:func:`task_framework_check` says when that app is missing (``delayq.W008``), or when there is
no framework at all (``delayq.E006``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from ..core.queue import Joined, set_implicit
from . import FrameworkMissing


class DelayqConfig(AppConfig):
    name = "delayq_transport.django"
    label = "delayq"
    verbose_name = "delayq"

    def ready(self) -> None:
        checks.register(task_framework_check)
        if delayq_task_aliases():
            try:  # Django 6: registers the backends' checks (the module docstring)
                from . import _framework  # noqa: F401
            except FrameworkMissing:
                pass  # delayq.E006 says so
        if not getattr(settings, "DELAYQ_JOIN_ATOMIC", False):
            set_implicit(None)
            return
        alias = getattr(settings, "DELAYQ_DATABASE", "default")
        if alias not in settings.DATABASES:
            raise ImproperlyConfigured(f"DELAYQ_DATABASE = {alias!r} is not in DATABASES")
        engine = settings.DATABASES[alias].get("ENGINE", "")
        if "postgresql" not in engine and "postgis" not in engine:
            raise ImproperlyConfigured(f"DELAYQ_JOIN_ATOMIC needs a PostgreSQL database; "
                                       f"DATABASES[{alias!r}] uses {engine!r}")
        set_implicit(atomic_transaction(alias))


def atomic_transaction(alias: str) -> Any:
    """What :func:`~delayq_transport.core.queue.current` asks outside a ``transaction()``
    block: the alias's connection of this thread while it is inside ``atomic()``."""

    hint = (f"Django: DELAYQ_DATABASE = {alias!r} joins the atomic() blocks of "
            f"DATABASES[{alias!r}]; set it to the alias of the broker's database, as "
            "CELERY_BROKER_URL = broker_url(DATABASES[alias]) names it, or set "
            "DELAYQ_JOIN_ATOMIC = False")

    def joined() -> Joined | None:
        connection = connections[alias]
        return Joined(connection, hint) if connection.in_atomic_block else None

    return joined


def delayq_task_aliases() -> list[str]:
    """The ``TASKS`` aliases whose backend is delayq's."""
    tasks = getattr(settings, "TASKS", None) or {}
    return sorted(alias for alias, entry in tasks.items()
                  if str(entry.get("BACKEND", "")).startswith("delayq_transport.django."))


def task_framework_check(app_configs: Sequence[AppConfig] | None = None,
                         **kwargs: Any) -> list[checks.CheckMessage]:
    """``delayq.E006``/``W008`` (the module docstring). Imports the framework only when
    ``TASKS`` names delayq's backend: a Celery project on Django 5.2 needs neither."""
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
