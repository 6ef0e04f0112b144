"""The Dramatiq app of the topology tests: one actor that records each run in the
``executions`` table of ``DELAYQ_RESULTS_URL`` (a server the test never stops)."""

from __future__ import annotations

import os

import dramatiq
import psycopg

from delayq_transport.dramatiq import DelayqBroker

broker = DelayqBroker(url=os.environ["DELAYQ_DATABASE_URL"], polling_interval=1.0)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="topology", max_retries=0)
def note(tag: str) -> None:
    with psycopg.connect(os.environ["DELAYQ_RESULTS_URL"], autocommit=True) as conn:
        conn.execute("INSERT INTO executions (task_id, name, arg, pid) VALUES (%s, %s, %s, %s)",
                     (tag, "dramatiq", tag, os.getpid()))
