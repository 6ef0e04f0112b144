"""``manage.py delayq_worker``: run the tasks of Django's task framework kept by delayq.

A management command rather than a ``delayq`` sub-command: a worker must import the project's
tasks, read its ``TASKS`` and ``DATABASES`` and use its ORM, which is what ``manage.py`` sets up
(django-tasks' ``db_worker`` and ``celery -A proj worker`` start from the project the same way).
See delayq_transport/django/worker.py for what a worker does, supervisor.py for its processes.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...backend import DelayqBackend, task_backends
from ...supervisor import serve, supervise
from ...worker import Worker


class Command(BaseCommand):
    help = "Run the tasks of a delayq task backend (Django's django.tasks)."
    # Checks would read delayq's table before the worker creates it or waits for it.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default",
                            help="The TASKS alias to run (default: default).")
        parser.add_argument("--queue-name", action="append", dest="queue_names",
                            metavar="NAME", help="A queue to take tasks from (repeatable; "
                            "default: the backend's QUEUES, or 'default').")
        parser.add_argument("--threads", type=int, default=4,
                            help="Tasks run at once per process (default: 4).")
        parser.add_argument("--processes", type=int, default=1,
                            help="Worker processes (default: 1, this one).")
        parser.add_argument("--no-scheduler", action="store_false", dest="schedule",
                            help="Do not install the backend's periodic tasks (OPTIONS "
                            "PERIODIC) from this worker: another worker or process does.")
        parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                            help="Seconds running tasks get to finish on SIGTERM/SIGINT; "
                            "what still runs then is given back (default: 30).")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["backend"]
        backend = task_backends[alias]
        if not isinstance(backend, DelayqBackend):
            raise CommandError(f"TASKS[{alias!r}] is {type(backend).__module__}."
                               f"{type(backend).__qualname__}, not delayq's DelayqBackend")
        threads, processes = options["threads"], options["processes"]
        if threads < 1 or processes < 1:
            raise CommandError("--threads and --processes must be at least 1")
        unknown = [q for q in options["queue_names"] or () if backend.queues
                   and q not in backend.queues]
        if unknown:
            raise CommandError(f"queue(s) {', '.join(map(repr, unknown))} not in "
                               f"TASKS[{alias!r}]['QUEUES'] ({sorted(backend.queues)})")
        if options["verbosity"] >= 2:
            logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                                format="%(asctime)s %(processName)s %(name)s: %(message)s")
        if processes > 1:
            self.stdout.write(f"delayq: {processes} worker processes, {threads} threads each")
            self.stdout.flush()
            if not supervise(processes, settings_module=settings.SETTINGS_MODULE, alias=alias,
                             queue_names=options["queue_names"], threads=threads,
                             shutdown_timeout=options["shutdown_timeout"],
                             schedule=options["schedule"]):
                sys.exit(1)  # a process gave tasks back (or was killed), as one worker says
            return

        def ready(worker: Worker) -> None:
            self.stdout.write(f"delayq: worker {worker.worker_id} ready: queues "
                              f"{', '.join(worker.queue_names)}, {threads} threads, table "
                              f"{backend.table}")
            self.stdout.flush()

        def stopping() -> None:
            self.stdout.write(f"delayq: worker stopping: running tasks get "
                              f"{options['shutdown_timeout']:g} s to finish")
            self.stdout.flush()

        finished = serve(backend, queue_names=options["queue_names"], threads=threads,
                         shutdown_timeout=options["shutdown_timeout"],
                         schedule=options["schedule"], on_ready=ready, on_stop=stopping)
        self.stdout.write(f"delayq: worker stopped{'' if finished else ' (tasks given back)'}")
        self.stdout.flush()
        if not finished:
            os._exit(1)  # tasks given back may still run on daemon threads
