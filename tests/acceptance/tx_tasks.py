"""Tasks of the transaction tests (test_transactions_celery.py), on the acceptance app: a
worker loads them with ``-I tx_tasks``. ``receipt`` reads the order its transaction wrote and
records whether it found it (the classic race: a task published inside ``atomic()`` ran before
the commit and found nothing)."""

from __future__ import annotations

import os

import psycopg
from celery_app import app, record

ORDERS_DDL = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)"


@app.task(bind=True, name="tx_tasks.receipt")
def receipt(self: object, order: str) -> None:
    with psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM orders WHERE id = %s", (order,)).fetchone()
    record(self.request.id, "receipt", {"order": order, "found": found is not None})  # type: ignore[attr-defined]
