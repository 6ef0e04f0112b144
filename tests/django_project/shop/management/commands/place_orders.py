"""``manage.py place_orders --count N --seed S``: N orders through the view (Django's test
client), a seeded half declined; prints the committed order ids as JSON. ``--sentinel``: then
one more receipt, published outside any transaction with a countdown, for order 0."""

from __future__ import annotations

import json
import random
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.test import Client

from shop.tasks import send_receipt


class Command(BaseCommand):
    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=10)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--linger", type=float, default=0.0)
        parser.add_argument("--sentinel", action="store_true")

    def handle(self, *args: Any, count: int, seed: int, linger: float, sentinel: bool,
               **options: Any) -> None:
        rng = random.Random(seed)
        client = Client()
        committed = []
        for i in range(count):
            decline = rng.random() < 0.5
            response = client.post("/orders/", {
                "item": f"item-{seed}-{i}", "linger": linger, "decline": "1" if decline else "0",
                "countdown": 1 if i % 3 == 2 else 0})
            body = response.json()
            assert response.status_code == 200 and body["committed"] is not decline, body
            if body["committed"]:
                committed.append(body["order"])
        if sentinel:
            send_receipt.apply_async((0,), countdown=2)
        self.stdout.write(json.dumps(committed))
