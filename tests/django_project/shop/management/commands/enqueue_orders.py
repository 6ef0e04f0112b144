"""``manage.py enqueue_orders --count N --seed S`` (Django 6): N transactions, each an order
and its ``record_order`` task enqueued inside ``atomic()`` (delayq's backend joins it), a seeded
half rolled back after the enqueue; prints the committed order ids as JSON."""

from __future__ import annotations

import json
import random
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from shop.djtasks import record_order
from shop.models import Order


class Declined(Exception):
    pass


class Command(BaseCommand):
    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=10)
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args: Any, count: int, seed: int, **options: Any) -> None:
        rng = random.Random(seed)
        committed = []
        for i in range(count):
            decline = rng.random() < 0.5
            try:
                with transaction.atomic():
                    order = Order.objects.create(item=f"task-{seed}-{i}")
                    record_order.enqueue(order.pk)
                    if decline:
                        raise Declined
            except Declined:
                continue
            committed.append(order.pk)
        self.stdout.write(json.dumps(committed))
