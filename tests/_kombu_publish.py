"""Publish one message from a separate process (``python _kombu_publish.py ...``).

Wake-up tests need the insert to come from *another* process after the consumer is already
waiting: nothing in the consumer's process may know about it except through PostgreSQL.
Prints one JSON line: when the publish started (wall clock) and the message's eta, if any.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta

import kombu

import delayq_transport  # noqa: F401  (registers the delayq+ scheme)


def publish(url: str, table: str, queue: str, body: str, countdown: float | None) -> dict:
    eta = None if countdown is None else datetime.now(UTC) + timedelta(seconds=countdown)
    headers = {} if eta is None else {"eta": eta.isoformat()}
    with kombu.Connection(url, transport_options={"table": table}) as conn:
        conn.default_channel  # noqa: B018 - connect before timing the publish itself
        started = time.time()
        kombu.Producer(conn.default_channel).publish(
            body, routing_key=queue, headers=headers,
            declare=[kombu.Queue(queue, routing_key=queue)],
        )
    return {"started": started, "eta": None if eta is None else eta.timestamp()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("table")
    parser.add_argument("queue")
    parser.add_argument("body")
    parser.add_argument("--countdown", type=float, default=None)
    args = parser.parse_args()
    print(json.dumps(publish(args.url, args.table, args.queue, args.body, args.countdown)),
          flush=True)


if __name__ == "__main__":
    main()
