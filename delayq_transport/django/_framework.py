"""Django's task framework, wherever this project has it: ``django.tasks`` (Django >= 6) or the
``django-tasks`` backport (import name ``django_tasks``, Django 4.2 to 5.2). Every module of
delayq's backend imports the framework from here only, so that the choice is made once.

The backport (0.12) has Django 6.0's API; where it differs, the difference is handled here,
by name, and nowhere else:

* ``InvalidTask``: the backport names it ``InvalidTaskError`` (and ``InvalidTaskBackend``
  ``InvalidTaskBackendError``). Each is the framework's own class under Django 6's name, so
  that ``except InvalidTask`` catches what that framework's ``Task`` raises.
* ``Task``: ``django.tasks`` exports it, ``django_tasks`` only from ``django_tasks.base``.
* ``normalize_json``: Django 6 has it in ``django.utils.json``, the backport in
  ``django_tasks.utils`` (the same function).
* system checks: Django 6 registers the backends' ``check()`` when ``django.tasks`` is first
  imported (delayq's app imports this module as it loads, apps.py); the backport only from
  its app ``django_tasks`` in ``INSTALLED_APPS`` (its README asks for it). That is not
  imported here behind the project's back: delayq's app warns (``delayq.W008``) without it.
* ``@task(**options)``: the backport passes extra keyword arguments on to the backend's
  ``task_class``; Django 6.0 takes none. delayq's :func:`~.backend.retry` is a decorator of
  its own on both, so nothing here depends on it.
* logging of the signals: the logger is ``django.tasks`` on Django 6, ``django_tasks`` on the
  backport (which logs a FAILED task with ``logger.exception``).

When both are importable (the backport also installs on Django 6), Django's own wins: its
``task_backends`` is the one ``TASKS`` configures for ``django.tasks.task``.
"""

from __future__ import annotations

import django

from . import FrameworkMissing

__all__ = [
    "BACKPORT", "SOURCE", "BaseTaskBackend", "FrameworkMissing", "InvalidTask",
    "InvalidTaskBackend", "Task", "TaskContext", "TaskError", "TaskResult",
    "TaskResultDoesNotExist", "TaskResultMismatch", "TaskResultStatus", "default_task_backend",
    "normalize_json", "task", "task_backends", "task_enqueued", "task_finished", "task_started",
]


if django.VERSION >= (6, 0):
    from django.tasks import (
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    #: Where the framework comes from: ``"django.tasks"`` or ``"django_tasks"`` (also the name
    #: of the logger each framework logs a task's life to).
    SOURCE = "django.tasks"
else:
    try:
        import django_tasks  # noqa: F401  (the backport: ModuleNotFoundError when absent)
    except ModuleNotFoundError as exc:
        if exc.name != "django_tasks":
            raise  # the backport is there but broken: say so, not "install it"
        raise FrameworkMissing(
            f"delayq's backend of Django's task framework needs Django >= 6 (django.tasks, "
            f"Python >= 3.12) or, on Django {django.get_version()}, the django-tasks backport "
            "(`pip install django-tasks`, import name django_tasks, with 'django_tasks' in "
            "INSTALLED_APPS)") from exc
    from django_tasks import (  # type: ignore[assignment, no-redef]
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[assignment, no-redef]

    # The backport's package does not export Task (Django 6's does): its module has it.
    from django_tasks.base import Task, TaskError  # type: ignore[assignment, no-redef]

    # Django 6 dropped the backport's "Error" suffix of these two: the backport's own classes,
    # under Django 6's names (what its Task and task_backends raise).
    from django_tasks.exceptions import (  # type: ignore[assignment, no-redef]
        InvalidTaskBackendError as InvalidTaskBackend,
    )
    from django_tasks.exceptions import (  # type: ignore[assignment, no-redef]
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import (  # type: ignore[assignment, no-redef]
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django_tasks.signals import (  # type: ignore[assignment, no-redef]
        task_enqueued,
        task_finished,
        task_started,
    )

    # Django 6 moved it to django.utils.json; the backport keeps its own copy.
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

    SOURCE = "django_tasks"

#: True when the framework is the django-tasks backport (Django < 6).
BACKPORT = SOURCE == "django_tasks"
