"""What delayq's ``manage.py`` commands share: which tables they work on (``--backend``, or
``--database`` and ``--table``: :func:`~delayq_transport.django.target.target`), and errors
as one line with exit status 1 (Django's ``CommandError``)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...core import DelayedQueue, DelayqError
from ..target import Target, close_queues, target


class TargetCommand(BaseCommand):
    """A command on one target's tables (the module docstring)."""

    # The system checks warn about delayq's tables (delayq.W002): these commands make them,
    # or say what is wrong with them themselves.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", metavar="ALIAS",
                            help="A TASKS backend of delayq's: its OPTIONS DATABASE and TABLE "
                                 "(default: 'default', else the first of delayq's)")
        parser.add_argument("--database", metavar="ALIAS",
                            help="A DATABASES alias instead of a backend (a Celery or "
                                 "Dramatiq project; default: DELAYQ_DATABASE, or 'default')")
        parser.add_argument("--table", metavar="NAME",
                            help="With --database: the queue table (default: DELAYQ_TABLE, or "
                                 "delayed_queue)")

    def target(self, options: dict[str, Any]) -> Target:
        if options.get("table") and not options.get("database") and options.get("backend"):
            raise CommandError("--table goes with --database, not --backend")
        try:
            return target(options.get("backend"), database=options.get("database"),
                          table=options.get("table"))
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None

    def open(self, where: Target) -> DelayedQueue:
        """The target's queue; a database that cannot be reached is a ``CommandError``."""
        try:
            return where.queue()
        except DelayqError as exc:
            raise CommandError(str(exc)) from None

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        finally:
            close_queues()
