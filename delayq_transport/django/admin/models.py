"""What Django's permissions are attached to: one unmanaged model per thing the admin shows.

delayq's tables are not Django's: the queue table's name is an option (``OPTIONS["TABLE"]``,
``DELAYQ_TABLE``), the results and the periodic entries are tables shared by every queue table,
and their rows change only through delayq's own statements. So these models are never queried
(no manager call reaches the database: the pages read through delayq's services, the same the
CLI and ``delayq web`` use), have no migrations (``migrate`` creates nothing for them) and exist
for what Django builds around a model: a content type and the permissions ``view``, ``change``
and ``delete``, which ``migrate`` creates as for any app, and the admin's index entries.

What each permission allows is said once, in :data:`.admin` (``ACTIONS``): ``view`` the pages,
``change`` what runs a task again (run now, retry, enable), ``delete`` what drops one (cancel,
discard, disable).
"""

from __future__ import annotations

from django.db import models

PERMISSIONS = ("view", "change", "delete")


class NoRows(models.Manager):  # type: ignore[type-arg]
    """Never reads: a queryset of these models is empty without a statement (``dumpdata`` of
    the project, say, passes them by)."""

    def get_queryset(self) -> models.QuerySet:  # type: ignore[type-arg]
        return super().get_queryset().none()


class Unmanaged(models.Model):
    """The permission holder of one page: no table of its own, no rows read."""

    objects = NoRows()

    class Meta:
        abstract = True
        managed = False  # its table (delayq_admin_<model>) never exists: nothing reads it
        base_manager_name = "objects"
        default_permissions = PERMISSIONS


class Task(Unmanaged):
    """Tasks waiting in the queue table (every front end's), or held by a worker."""

    class Meta(Unmanaged.Meta):
        verbose_name = "waiting task"
        verbose_name_plural = "waiting tasks"


class Result(Unmanaged):
    """The results of ``django.tasks`` tasks (``delayq_task_results``)."""

    class Meta(Unmanaged.Meta):
        verbose_name = "task result"
        verbose_name_plural = "task results"


class DeadLetter(Unmanaged):
    """Messages no worker takes again, every front end's (formats/deadletters.py)."""

    class Meta(Unmanaged.Meta):
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"


class QueueControl(Unmanaged):
    """A queue paused or limited for every worker (docs/how-to/limits.md)."""

    class Meta(Unmanaged.Meta):
        verbose_name = "queue control"
        verbose_name_plural = "queue controls"


class PeriodicEntry(Unmanaged):
    """Periodic entries of the scheduling engine (Celery beat, Dramatiq, ``django.tasks``)."""

    class Meta(Unmanaged.Meta):
        verbose_name = "periodic entry"
        verbose_name_plural = "periodic entries"
