"""CPU of one single-row publish: the producer, its PostgreSQL backend, the listener.

``DelayedQueue.offer(durable=False)`` (what the kombu transport's ``_put`` calls by default) of
a ~1 KB payload, N times on one connection of a fresh database, while another process LISTENs
to the table's wake-ups. Reported per publish: the publishing process' CPU (``process_time``),
the CPU of its PostgreSQL backend and of the listening backend (psutil, so the server must run
on this machine), the wall time, and the NOTIFYs the listener received. Several repetitions,
each on a fresh database; medians. To compare revisions, run it once per revision with
``PYTHONPATH`` pointing at each checkout, under the bench lock, one right after the other.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import click
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common, the harness

from _common import DEFAULT_ADMIN_URL, console, cpu_seconds, fresh_database  # noqa: E402

from delayq_transport import Database, DelayedQueue  # noqa: E402
from delayq_transport.core.db.queries import notify_channel  # noqa: E402

PAYLOAD = b"x" * 972  # a Celery no-op task message as the transport stores it
WARM_UP = 200  # publishes before the clock starts: connection, prepared statement, plan

_LISTENER = """
import sys, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
conn.execute("LISTEN " + sys.argv[2])
print(conn.info.backend_pid, flush=True)
n = 0
for note in conn.notifies():
    if note.payload.startswith("stop:"):
        break
    n += 1
print(n, flush=True)
"""


def _cpu_s(pid: int) -> float:
    return cpu_seconds(psutil.Process(pid))


def one_run(url: str, n: int) -> dict[str, float]:
    """µs per publish of each process, on a fresh database."""
    listener = subprocess.Popen([sys.executable, "-c", _LISTENER, url,
                                 notify_channel("delayed_queue")],
                                stdout=subprocess.PIPE, text=True)
    assert listener.stdout is not None
    listener_pid = int(listener.stdout.readline())
    with Database(url, max_size=1) as db, DelayedQueue(db, kind="celery") as queue:
        for _ in range(WARM_UP):
            queue.offer(str(uuid.uuid4()), PAYLOAD, durable=False)
        backend_pid = db.run(lambda c: c.info.backend_pid, relaxed=True)
        keys = [str(uuid.uuid4()) for _ in range(n)]
        before = time.process_time(), _cpu_s(backend_pid), _cpu_s(listener_pid)
        wall = time.perf_counter()
        for key in keys:
            queue.offer(key, PAYLOAD, durable=False)
        wall = time.perf_counter() - wall
        time.sleep(0.3)  # the listener's backend sends what it was signalled for
        after = time.process_time(), _cpu_s(backend_pid), _cpu_s(listener_pid)
        queue.with_kind("stop").offer("stop", b"", durable=False)
    notifies = int(listener.stdout.readline())
    listener.wait()
    client, backend, listen = (1e6 * (a - b) / n for a, b in zip(after, before, strict=True))
    return {"producer_us": client, "backend_us": backend, "listener_us": listen,
            "wall_us": 1e6 * wall / n, "notifies_per_publish": (notifies - WARM_UP) / n}


@click.command()
@click.option("--publishes", default=4000, show_default=True)
@click.option("--repeat", default=4, show_default=True, help="Fresh databases, medians shown.")
@click.option("--admin-url", default=DEFAULT_ADMIN_URL, show_default=True)
def main(publishes: int, repeat: int, admin_url: str) -> None:
    runs = []
    for _ in range(repeat):
        with fresh_database(admin_url, prefix="delayq_profile_publish") as url:
            runs.append(one_run(url, publishes))
        console.print({k: round(v, 2) for k, v in runs[-1].items()})
    medians = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
    print(json.dumps({"median_of": repeat, **medians,
                      "load_average": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
