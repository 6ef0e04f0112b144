"""The Celery app of the Spark reminders example: one ``remind`` task on the delayq broker.

Run a worker from the examples/ directory::

    DELAYQ_BROKER_URL=delayq+postgresql://postgres@127.0.0.1:5432/test \
        celery -A spark_reminders_app worker -l INFO

``examples/spark_reminders.py`` writes the rows; this worker runs each at its ETA.
"""

from __future__ import annotations

import logging
import os

from celery import Celery

import delayq_transport.transport  # noqa: F401  (registers the delayq+postgresql:// broker URL)

app = Celery("spark_reminders_app")
app.conf.update(
    broker_url=os.environ.get("DELAYQ_BROKER_URL",
                              "delayq+postgresql://postgres@127.0.0.1:5432/test"),
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    enable_utc=True,
    timezone="UTC",
)
log = logging.getLogger(__name__)


@app.task(name="spark_reminders_app.remind")
def remind(user_id: int, email: str, renewal_date: object) -> str:
    """Send the renewal reminder (here: log it; a real app would e-mail)."""
    text = f"user {user_id} <{email}>: your plan renews on {renewal_date}"
    log.info("remind: %s", text)
    return text
