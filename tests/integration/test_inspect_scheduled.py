"""What ``celery inspect scheduled`` answers on delayq (transport/control.py), without a worker:
the waiting rows of the queues a channel consumes, read from a real table. The acceptance test
(tests/acceptance/test_inspect_scheduled.py) asks a real worker through the broker."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import kombu
import psycopg
import pytest
from celery.worker.control import Panel

from delayq_transport import DelayedQueue
from delayq_transport.transport import control

pytestmark = pytest.mark.timeout(60)
pytest_plugins = ("_kombu_env",)


def test_waiting_rows_of_the_consumed_queues_in_celerys_reply_format(
        kombu_connect: Callable[..., kombu.Connection], kombu_db: str, kombu_table: str) -> None:
    now = datetime.now(UTC)
    with kombu_connect() as conn:
        channel = conn.channel()
        producer = kombu.Producer(channel)

        def task(tid: str, queue: str, minutes: float, priority: int = 0) -> None:
            eta = (now + timedelta(minutes=minutes)).isoformat()
            producer.publish([[tid], {"k": 1}, {}], routing_key=queue, serializer="json",
                             headers={"task": "app.t", "id": tid, "eta": eta}, priority=priority,
                             declare=[kombu.Queue(queue)])

        task("later", "work", 10)
        task("soon", "work", 5, priority=6)
        task("held", "work", 7)
        task("due", "work", -1)
        task("elsewhere", "other", 1)
        with DelayedQueue(kombu_db, kind="work", table=kombu_table) as q:  # not a Celery task
            q.offer("raw", b'{"not": "kombu"}', now + timedelta(minutes=2))
        with psycopg.connect(kombu_db, autocommit=True) as db:  # a worker leased it
            db.execute(f"""UPDATE "{kombu_table}" SET "lockUuid" = 'w1',
                           "scheduledAt" = "scheduledAt" + 600000 WHERE "pKey" = 'held'""")
            stored = dict(db.execute(f'SELECT "pKey", "scheduledAt" FROM "{kombu_table}"'))
        consumer = kombu.Consumer(channel, queues=[kombu.Queue("work")], callbacks=[])
        consumer.consume()

        entries = control.waiting(channel, "worker@h")
        assert [e["request"]["id"] for e in entries] == ["soon", "later"], entries
        first = entries[0]
        assert first["eta"] == datetime.fromtimestamp(stored["soon"] / 1000, UTC).isoformat()
        assert first["priority"] == 6 and first["request"]["args"] == ["soon"]
        assert first["request"]["kwargs"] == {"k": 1} and first["request"]["name"] == "app.t"
        assert first["request"]["delivery_info"]["routing_key"] == "work"
        assert [e["request"]["id"] for e in control.waiting(channel, "w", limit=1)] == ["soon"]

        # The command in Celery's registry answers from the table only for a delayq consumer.
        control.register()
        scheduled = Panel.data["scheduled"]
        assert Panel.data["dump_schedule"] is scheduled

        def state(task_channel: object) -> SimpleNamespace:
            timer = SimpleNamespace(schedule=SimpleNamespace(queue=[]))
            return SimpleNamespace(consumer=SimpleNamespace(
                timer=timer, hostname="worker@h",
                task_consumer=SimpleNamespace(channel=task_channel)))

        assert [e["request"]["id"] for e in scheduled(state(channel))] == ["soon", "later"]
        assert scheduled(state(object())) == []  # another broker's worker: Celery's answer
