"""Closing the broker connections of a Celery app that published from the test process."""

from __future__ import annotations

from typing import Any


def close_connections(app: Any) -> None:
    """Close the broker connections an app opened to publish. ``Celery.close()`` only forgets
    its connection pool: the connections stay open, and each holds the transport's PostgreSQL
    pool, which keeps reconnecting to the test's database after it was dropped."""
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    producers = app.amqp._producer_pool
    if producers is not None:
        producers.force_close_all()
        app.amqp._producer_pool = None
