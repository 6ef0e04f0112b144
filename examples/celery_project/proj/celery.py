"""A Celery project that moved from Redis to delayq by changing its broker URL.

    export DELAYQ_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres
    celery -A proj worker -l INFO           # in one shell
    python -m proj.send                     # in another
"""

from __future__ import annotations

import os

from celery import Celery

import delayq_transport  # noqa: F401  - the one extra step: registers the delayq+ scheme

DATABASE_URL = os.environ.get("DELAYQ_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

app = Celery("proj", include=["proj.tasks"])
app.conf.update(
    # was: broker_url = "redis://localhost:6379/0"
    broker_url="delayq+" + DATABASE_URL,
    broker_transport_options={
        "acquire_timeout": 60,     # seconds an unacked message stays leased (extended while held)
        "polling_interval": 5,     # fallback poll; LISTEN/NOTIFY wakes the worker before that
    },
    broker_connection_retry_on_startup=True,
    task_acks_late=True,           # safe: a long task's lease is extended while its worker lives
)
