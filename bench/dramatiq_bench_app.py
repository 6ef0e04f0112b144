"""The Dramatiq app every broker of bench/bench_dramatiq.py runs (the broker comes from env).

``DQB_BROKER`` is one of ``delayq``, ``delayq_buffered`` (delayq with ``publish_linger``),
``pg`` (dramatiq-postgres), ``redis``, ``rabbitmq``;
``DQB_URL`` its URL; ``DQB_COUNTER`` a Redis database where each run reports with one round
trip (count, first and last run time, lateness of delayed messages), whatever the broker.
"""

from __future__ import annotations

import os
import time

import dramatiq
import redis

if __name__ == "__main__":  # a module bench_dramatiq.py's processes load, not a script
    print(__doc__)
    raise SystemExit(0)

KIND = os.environ["DQB_BROKER"]
URL = os.environ["DQB_URL"]
QUEUE = os.environ.get("DQB_QUEUE", "bench")

broker: dramatiq.Broker
#: ``delayq_buffered``: sends written in batches every 5 ms (opt-in; a send returns before its
#: row is written).
BUFFERED_LINGER_S = 0.005
if KIND in ("delayq", "delayq_buffered"):
    from delayq_transport.dramatiq import DelayqBroker

    broker = DelayqBroker(url=URL,
                          publish_linger=BUFFERED_LINGER_S if KIND == "delayq_buffered" else 0)
elif KIND == "pg":
    from dramatiq_postgres import PostgresBroker

    broker = PostgresBroker(url=URL, results=False)
elif KIND == "redis":
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=URL)
elif KIND == "rabbitmq":
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=URL)
else:
    raise SystemExit(f"unknown DQB_BROKER {KIND!r}")
dramatiq.set_broker(broker)
counter = redis.Redis.from_url(os.environ["DQB_COUNTER"])


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop(eta_ms: float | None = None) -> None:
    now = time.time()
    pipe = counter.pipeline(transaction=False)
    pipe.incr("n")
    pipe.setnx("first", now)
    pipe.set("last", now)
    if eta_ms is not None:
        pipe.rpush("late", now * 1000 - eta_ms)
    pipe.execute()


def send(count: int, delay_ms: int | None = None) -> None:
    """Producer body: ``count`` no-op messages, each delayed ``delay_ms`` if given.

    The first send's time goes to the counter (``sent0``, earliest producer wins), so end to
    end is measured from the first send, not from the producers' interpreter start.
    """
    counter.setnx("sent0", time.time())
    for _ in range(count):
        if delay_ms is None:
            noop.send()
        else:
            noop.send_with_options(kwargs={"eta_ms": time.time() * 1000 + delay_ms},
                                   delay=delay_ms)
    counter.set("sent_end", time.time())  # the last producer to finish writes last
