"""``manage.py bench_enqueue --count N [--spread S]`` (Django 6, bench/bench_djtasks.py): N
``shop.djtasks.add`` tasks through the configured ``TASKS`` backend, each outside any
transaction; with ``--spread`` each deferred to a run_after spread evenly over 1..1+S seconds
from now. Prints ``{"started_ms", "done_ms"}`` (epoch ms around the enqueues) as JSON."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from shop.djtasks import add


class Command(BaseCommand):
    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=1000)
        parser.add_argument("--spread", type=float, default=0.0)

    def handle(self, *args: Any, count: int, spread: float, **options: Any) -> None:
        started = time.time()
        base = timezone.now() + timedelta(seconds=1)
        for i in range(count):
            task = add
            if spread:
                task = add.using(run_after=base + timedelta(seconds=spread * i / count))
            task.enqueue(i, i)
        self.stdout.write(json.dumps({"started_ms": int(started * 1000),
                                      "done_ms": int(time.time() * 1000)}))
