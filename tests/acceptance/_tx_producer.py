"""A producer process of test_transactions_celery.py, publishing in its own transactions.

``run URL NAME SEED COUNT``: COUNT transactions, each inserting an order and publishing its
receipt (``delay`` or a 1 s countdown) inside it; a seeded half roll back. Prints the committed
orders as JSON. ``hold URL NAME COUNT``: one transaction publishing COUNT receipts, then
prints HOLDING and waits to be killed.
"""

from __future__ import annotations

import json
import random
import sys
import time

import psycopg
from celery_app import app
from tx_tasks import receipt

from delayq_transport import transaction


def run(url: str, name: str, seed: int, count: int) -> None:
    rng = random.Random(seed)
    committed = []
    with psycopg.connect(url, application_name=name) as conn:
        for i in range(count):
            order = f"{name}-{i}"
            conn.execute("INSERT INTO orders (id) VALUES (%s)", (order,))
            with transaction(conn):
                if i % 2:
                    receipt.apply_async((order,), countdown=1)
                else:
                    receipt.delay(order)
            if rng.random() < 0.5:
                conn.rollback()
            else:
                conn.commit()
                committed.append(order)
    print(json.dumps(committed), flush=True)


def hold(url: str, name: str, count: int) -> None:
    conn = psycopg.connect(url, application_name=name)
    conn.execute("INSERT INTO orders (id) VALUES (%s)", (name,))
    with transaction(conn):
        ids = [receipt.delay(name).id for _ in range(count)]
    print(json.dumps(ids), flush=True)
    print("HOLDING", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    app.conf.broker_url = "delayq+" + sys.argv[2]
    if sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        hold(sys.argv[2], sys.argv[3], int(sys.argv[4]))
