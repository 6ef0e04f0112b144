"""``manage.py delayq_migrate``: create or upgrade delayq's tables in the database ``DATABASES``
names, the release step of a Django project (``delayq migrate`` without a URL built by hand).

A command of its own rather than Django's ``migrate``: delayq's tables are shared with
processes that are not Django's (Celery and Dramatiq workers, ``delayq`` itself) and versioned
by delayq's own ledger, applied under its own advisory lock, possibly as another role
(docs/how-to/roles.md); as Django migrations they would follow ``migrate``'s graph (``--fake``,
``zero``, squashing) that cannot undo them. Run it next to ``migrate`` in the release.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ....core import DatabaseUnavailable, DelayqError, migrate
from ....core.schema import missing_migrations
from ...apps import delayq_task_aliases
from ...target import Target, target
from ..base import TargetCommand


class Command(TargetCommand):
    help = ("Create or upgrade delayq's tables (idempotent, safe to run concurrently): every "
            "delayq TASKS backend's, or the one --backend or --database names.")

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--check", action="store_true",
                            help="Apply nothing; exit 1 when a migration is missing (a "
                                 "deploy's gate)")

    def handle(self, *args: Any, **options: Any) -> None:
        missing_any = False
        for where in self.targets(options):
            queue = self.open(where)
            try:
                if options["check"]:
                    missing = [m.version for m in missing_migrations(queue.db, where.table)]
                    missing_any = missing_any or bool(missing)
                    self.stdout.write(f"{where.table} in DATABASES[{where.database!r}]: "
                                      + (f"missing {missing}" if missing else "current"))
                    continue
                applied = migrate(queue.db, where.table)
            except (DatabaseUnavailable, DelayqError) as exc:
                raise CommandError(f"{where.table} in DATABASES[{where.database!r}]: {exc}"
                                   ) from None
            self.stdout.write(f"{where.table} in DATABASES[{where.database!r}]: "
                              + (f"applied {applied}" if applied else "already current"))
        if missing_any:
            raise CommandError("delayq's tables lack migrations: run manage.py delayq_migrate")

    def targets(self, options: dict[str, Any]) -> list[Target]:
        """The one named, else every delayq backend's distinct tables (or the default)."""
        if options.get("backend") or options.get("database") or options.get("table"):
            return [self.target(options)]
        aliases = delayq_task_aliases()
        if not aliases:
            return [self.target(options)]
        found: dict[tuple[str, str], Target] = {}
        for alias in aliases:
            t = target(alias)
            found.setdefault((t.database, t.table), t)
        return list(found.values())
