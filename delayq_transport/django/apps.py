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
:func:`~.checks.task_framework_check` says when that app is missing (``delayq.W008``), or when
there is no framework at all (``delayq.E006``).
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from ..core.queue import Joined, set_implicit
from . import FrameworkMissing
from .checks import delayq_task_aliases, task_framework_check


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
