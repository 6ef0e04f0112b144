"""``manage.py delayq_prune``: delete the results of ``django.tasks`` tasks that finished
longer ago than a retention, as the workers do every few minutes (``RESULT_RETENTION``): for a
retention the workers do not apply (``RESULT_RETENTION = None``, a one-off clean-up), or with
no worker running. Batches of 1,000 by the results' (table, finishedAt) index: a long prune
holds no lock a worker waits for."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ....browse import parse_duration
from ....core import DatabaseUnavailable, DelayqError, TaskResults
from ....formats.django_tasks import KIND_PREFIX
from ..base import TargetCommand


class Command(TargetCommand):
    help = "Delete the results of django.tasks tasks that finished before a retention."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--older-than", metavar="DURATION",
                            help="Finished longer ago than this: 90s, 15m, 12h, 30d (default: "
                                 "the backend's RESULT_RETENTION)")

    def handle(self, *args: Any, **options: Any) -> None:
        where = self.target(options)
        text = options["older_than"]
        try:
            retention_s = parse_duration(text, "--older-than").total_seconds() if text else \
                where.options["RESULT_RETENTION"]
        except DelayqError as exc:
            raise CommandError(str(exc)) from None
        if retention_s is None:
            raise CommandError(f"{where.where}: RESULT_RETENTION is None (results kept "
                               "forever): give --older-than")
        queue = self.open(where)
        try:
            before_ms = int(queue.now().timestamp() * 1000 - retention_s * 1000)
            deleted = TaskResults(queue, KIND_PREFIX).prune(before_ms)
        except (DatabaseUnavailable, DelayqError) as exc:
            raise CommandError(f"{where.table} in DATABASES[{where.database!r}]: {exc}"
                               ) from None
        before = datetime.fromtimestamp(before_ms / 1000, UTC).isoformat(timespec="seconds")
        self.stdout.write(f"deleted {deleted} result(s) of {where.table} finished before "
                          f"{before}")
