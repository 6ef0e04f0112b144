"""``delayq_transport.django.tasks``: delayq's backend of Django's task framework, as settings
name it::

    TASKS = {"default": {"BACKEND": "delayq_transport.django.tasks.DelayqBackend"}}

and :func:`retry`, a task's own retry policy. The implementation is :mod:`.backend` (and
:mod:`.worker`, ``manage.py delayq_worker``); docs/how-to/django-tasks.md.

Importable on any Django: Celery's Django fixup imports the ``tasks`` module of every
installed app, this one's included, and a project on Django 5.2 with the app installed for
Celery (and without the django-tasks backport) must not fail there. Without a task framework
(:mod:`._framework`: ``django.tasks`` of Django >= 6, else ``django_tasks``) the names raise
:class:`~delayq_transport.django.FrameworkMissing` (an ``ImproperlyConfigured``) when used.
"""

from __future__ import annotations

from typing import Any

from . import FrameworkMissing

try:
    from .backend import KIND_PREFIX, DelayqBackend, kind_of, kinds_for, retry, task_backends
except FrameworkMissing as exc:  # Django < 6 without the backport
    _WHY = str(exc)

    def __getattr__(name: str) -> Any:
        raise FrameworkMissing(f"delayq_transport.django.tasks.{name}: {_WHY}")

__all__ = ["KIND_PREFIX", "DelayqBackend", "kind_of", "kinds_for", "retry", "task_backends"]
