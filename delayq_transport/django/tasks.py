"""``delayq_transport.django.tasks``: delayq's backend of Django's task framework, as settings
name it::

    TASKS = {"default": {"BACKEND": "delayq_transport.django.tasks.DelayqBackend"}}

and :func:`retry`, a task's own retry policy. The implementation is :mod:`.backend` (and
:mod:`.worker`, ``manage.py delayq_worker``); docs/how-to/django-tasks.md.

Importable on any Django: Celery's Django fixup imports the ``tasks`` module of every
installed app, this one's included, and a project on Django 5.2 with the app installed for
Celery must not fail there. Without ``django.tasks`` (Django < 6) the names raise
``ImproperlyConfigured`` when used.
"""

from __future__ import annotations

from typing import Any

try:
    from .backend import KIND_PREFIX, DelayqBackend, kind_of, kinds_for, retry, task_backends
except ModuleNotFoundError as exc:  # Django < 6
    if not (exc.name or "").startswith("django.tasks"):
        raise
    _WHY = str(exc)

    def __getattr__(name: str) -> Any:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"delayq_transport.django.tasks.{name}: delayq's backend of Django's task "
            f"framework needs Django 6 or newer (Python 3.12+): {_WHY}")

__all__ = ["KIND_PREFIX", "DelayqBackend", "kind_of", "kinds_for", "retry", "task_backends"]
