"""``manage.py delayq_health``: is delayq healthy? For monitoring: exit status 0 when every
check passes, 1 when one fails (or the database cannot be reached), 2 for a usage error; one
line per check, or ``--json`` (printed also when a check fails). The checks and their
thresholds: :mod:`delayq_transport.browse.health`."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ....browse.health import Check, Limits, run_checks
from ....browse.service import kept_kind
from ....core import DatabaseUnavailable
from ....formats.celery import kinds_for
from ....formats.django_tasks import KIND_PREFIX
from ...target import Target
from ..base import TargetCommand


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(text)
    return value


class Command(TargetCommand):
    help = ("Check that delayq is healthy: its tables current, no due task waiting longer "
            "than --max-due-age, at most --max-failed failures in --window, nothing holding "
            "back the table's cleanup. Exit status 0: healthy; 1: a check failed.")

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--max-due-age", type=_non_negative, default=300.0,
                            metavar="SECONDS", help="Fail when a due task of the backend's "
                            "queues waited longer (default: 300; 0: any due task fails)")
        parser.add_argument("--queue-name", action="append", dest="queue_names",
                            metavar="NAME", help="Watch this queue only (repeatable; default: "
                            "the backend's QUEUES, or every queue of the table)")
        parser.add_argument("--max-failed", type=int, metavar="N",
                            help="Fail when more than N django.tasks tasks failed for good in "
                                 "the window (default: not checked)")
        parser.add_argument("--window", type=_non_negative, default=3600.0, metavar="SECONDS",
                            help="The window of --max-failed (default: 3600)")
        parser.add_argument("--strict", action="store_true",
                            help="Fail on the database's warnings too, not only its critical "
                                 "ones")
        parser.add_argument("--json", action="store_true", dest="as_json",
                            help="One JSON object: {ok, checks: [{name, ok, detail, figures}]}")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["max_failed"] is not None and options["max_failed"] < 0:
            raise CommandError("--max-failed must be 0 or more")
        where = self.target(options)
        limits = Limits(options["max_due_age"], options["max_failed"], options["window"],
                        options["strict"])
        try:
            queue = where.queue()
        except DatabaseUnavailable as exc:
            checks = [Check("database", False, f"unreachable: {exc}")]
        else:
            checks = run_checks(queue, watched(where, options["queue_names"]), limits,
                                "run `manage.py delayq_migrate`")
        ok = all(c.ok for c in checks)
        if options["as_json"]:
            self.stdout.write(json.dumps({"ok": ok, "table": where.table,
                                          "database": where.database,
                                          "checks": [c.as_dict() for c in checks]}))
        else:
            for c in checks:
                self.stdout.write(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
        if not ok:
            self.stderr.write("delayq: unhealthy: " + "; ".join(
                c.name for c in checks if not c.ok))
            sys.exit(1)


def watched(where: Target, queue_names: list[str] | None) -> Any:
    """Which kinds the backlog check watches: the queues named, else the backend's (its
    django.tasks kinds at every priority), else every kind but dead letters."""
    names = queue_names or list(where.queues)
    if names:
        prefixes = tuple(f"{KIND_PREFIX}{q}:" for q in names)
        others = {k for q in names for k in kinds_for(q)}  # a Celery queue's priority kinds
        return lambda kind: kind.startswith(prefixes) or kind in others
    if where.backend:
        return lambda kind: kind.startswith(KIND_PREFIX)
    return lambda kind: not kept_kind(kind)
