"""A Dramatiq app on delayq: long delays wait in PostgreSQL, periodic actors run exactly once.

Run (from the examples/ directory; the schema is created on first use)::

    export DELAYQ_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test
    dramatiq dramatiq_app -p 2 -t 4            # any number of these, on any hosts
    python dramatiq_app.py                     # sends a few messages
    delayq beat list                           # the periodic actors and their next runs

Every worker process also refreshes the periodic actors (``PeriodicMiddleware``); the
occurrences are installed an hour ahead, so they still run while every worker restarts.
"""

from __future__ import annotations

import os
from datetime import timedelta

import dramatiq
from dramatiq.middleware import CurrentMessage

from delayq_transport.dramatiq import DelayqBroker
from delayq_transport.dramatiq.periodic import PeriodicMiddleware, periodic

broker = DelayqBroker(
    url=os.environ.get("DELAYQ_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    max_priority=3,                 # broker_priority 0..3, higher first (as on RabbitMQ)
    dead_message_ttl=14 * 86_400_000,  # dead letters kept two weeks (ms, Dramatiq's unit)
)
broker.add_middleware(CurrentMessage())
broker.add_middleware(PeriodicMiddleware(refresh_interval=60, horizon=3600))
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=5, min_backoff=1_000)
def send_reminder(user_id: int, text: str) -> None:
    print(f"reminder for user {user_id}: {text}")


@periodic(cron="30 7 * * mon-fri", tz="Europe/Paris", misfire="skip", grace=600)
@dramatiq.actor(queue_name="reports")
def morning_report() -> None:
    msg = CurrentMessage.get_current_message()
    print(f"morning report for occurrence {msg.message_timestamp if msg else '?'}")


@periodic(every=timedelta(seconds=30))
@dramatiq.actor
def heartbeat() -> None:
    print("still alive")


if __name__ == "__main__":
    send_reminder.send(1, "now")
    send_reminder.send_with_options(args=(2, "in 90 days"), delay=90 * 86_400_000)
    send_reminder.send_with_options(args=(3, "urgent"), broker_priority=3)
    print("sent; queue default:", broker.stats("default"))
    broker.close()
