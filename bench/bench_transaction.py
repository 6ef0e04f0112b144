"""Tasks in the application's transaction: what publishing inside it costs.

Two measures, each mode interleaved with the others round by round, medians reported:

* **per unit of work**: an application transaction that inserts one order and publishes one
  Celery task for it (``send_task``, no worker): the task written in that transaction
  (``delayq_transport.transaction``), delayq's normal publish made inside it (its own commit:
  the task escapes a rollback), the publish made after the commit (``transaction.on_commit``'s
  order: the task is lost if the process dies in between) on delayq, Redis and RabbitMQ. The
  whole unit's latency and the publish call's alone, in microseconds.
* **a Django view**: the test suite's project (tests/django_project) serving its order view
  through Django's test client in a process of its own per mode and round, persistent
  database connections (``CONN_MAX_AGE`` 60, as in production): requests per second with
  ``DELAYQ_JOIN_ATOMIC``, with delayq's normal publish inside ``atomic()``, and with
  ``transaction.on_commit`` on delayq, Redis and RabbitMQ.

Usage: ``python bench/bench_transaction.py [--rounds 5] [--units 500] [--seconds 5]
[--brokers delayq,redis,amqp] [--quick] [--no-docs]``. Needs Redis on 127.0.0.1:6379 (db 10)
and RabbitMQ on 127.0.0.1:5672 for their modes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from typing import Any

import click
import psycopg
from _common import (
    REPO_ROOT,
    command_line,
    console,
    database_url_option,
    fresh_database,
    git_revision,
    load_results,
    machine_info,
    markdown_table,
    percentile,
    prose,
    run_line,
    times,
    write_results,
)
from _targets import replace_section

REDIS_URL = "redis://127.0.0.1:6379/10"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
PROJECT = REPO_ROOT / "tests" / "django_project"
ORDERS_DDL = "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text)"

#: Unit modes: (name, broker, when the publish happens relative to the application's commit).
UNIT_MODES = [
    ("in your transaction", "delayq", "joined"),
    ("delayq publish inside (own commit)", "delayq", "inside"),
    ("delayq publish after commit", "delayq", "after"),
    ("Redis publish after commit", "redis", "after"),
    ("RabbitMQ publish after commit", "amqp", "after"),
]
#: View modes: (name, broker, DELAYQ_JOIN_ATOMIC, the view's on_commit).
VIEW_MODES = [
    ("in atomic() (DELAYQ_JOIN_ATOMIC)", "delayq", True, False),
    ("delayq publish inside atomic() (own commit)", "delayq", False, False),
    ("delayq on_commit", "delayq", False, True),
    ("Redis on_commit", "redis", False, True),
    ("RabbitMQ on_commit", "amqp", False, True),
]


# -- per unit of work ---------------------------------------------------------------------


def celery_app(broker: str, db_url: str, queue: str) -> Any:
    from celery import Celery

    import delayq_transport  # noqa: F401  (registers the delayq+ scheme)

    url = {"delayq": "delayq+" + db_url, "redis": REDIS_URL, "amqp": AMQP_URL}[broker]
    app = Celery(f"bench-tx-{broker}", set_as_current=False)
    app.conf.update(broker_url=url, task_default_queue=queue)
    return app


def run_units(app: Any, conn: psycopg.Connection[Any], when: str, n: int
              ) -> tuple[list[float], list[float]]:
    """``n`` units; per unit (whole, publish alone) in microseconds."""
    from delayq_transport import transaction

    whole, publish = [], []
    clock = time.perf_counter
    for i in range(n):
        start = clock()
        conn.execute("INSERT INTO orders (item) VALUES (%s)", (f"u{i}",))
        if when == "after":
            conn.commit()
        p0 = clock()
        if when == "joined":
            with transaction(conn):
                app.send_task("bench.receipt", (i,))
        else:
            app.send_task("bench.receipt", (i,))
        p1 = clock()
        if when != "after":
            conn.commit()
        whole.append((clock() - start) * 1e6)
        publish.append((p1 - p0) * 1e6)
    return whole, publish


def bench_units(db_url: str, rounds: int, units: int, brokers: set[str]
                ) -> dict[str, Any]:
    queue = f"bench_tx_{uuid.uuid4().hex[:8]}"
    modes = [m for m in UNIT_MODES if m[1] in brokers]
    apps = {b: celery_app(b, db_url, queue) for b in {m[1] for m in modes}}
    results: dict[str, dict[str, list[float]]] = {m[0]: {"whole": [], "publish": [],
                                                         "p99": []} for m in modes}
    with psycopg.connect(db_url) as conn, ExitStack() as stack:
        conn.execute(ORDERS_DDL)
        conn.commit()
        for app in apps.values():
            stack.callback(_close_app, app)
            app.send_task("bench.receipt", (-1,))  # connects once, as a warm process has
        for r in range(rounds):
            for name, broker, when in (modes if r % 2 == 0 else modes[::-1]):
                whole, publish = run_units(apps[broker], conn, when, units)
                results[name]["whole"].append(statistics.median(whole))
                results[name]["publish"].append(statistics.median(publish))
                results[name]["p99"].append(percentile(whole, 99) or 0.0)
                console.print(f"round {r + 1}/{rounds} {name}: unit "
                              f"{statistics.median(whole):.0f} us, publish "
                              f"{statistics.median(publish):.0f} us")
    _purge(brokers, queue)
    return {name: {"unit_us": statistics.median(v["whole"]),
                   "publish_us": statistics.median(v["publish"]),
                   "unit_p99_us": statistics.median(v["p99"]), "rounds": v}
            for name, v in results.items()}


def _close_app(app: Any) -> None:
    if app._pool is not None:
        app._pool.force_close_all()
    if app.amqp._producer_pool is not None:
        app.amqp._producer_pool.force_close_all()
    app.close()


def _purge(brokers: set[str], queue: str) -> None:
    """Leave nothing behind on the shared Redis and RabbitMQ."""
    if "redis" in brokers:
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()
    if "amqp" in brokers:
        from kombu import Connection

        with Connection(AMQP_URL) as conn:
            conn.default_channel.queue_delete(queue)
            conn.default_channel.exchange_delete(queue)


# -- a Django view ------------------------------------------------------------------------


def view_env(db_url: str, broker: str, join: bool, queue: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE="djproject.settings",
        DJANGO_DELAYQ_JOIN_ATOMIC="1" if join else "0", DJANGO_CONN_MAX_AGE="60",
        DJANGO_TASK_QUEUE=queue,
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(PROJECT), env.get("PYTHONPATH", "")]))
    if broker != "delayq":
        env["DJANGO_BROKER_URL"] = REDIS_URL if broker == "redis" else AMQP_URL
    return env


def serve_view(seconds: float, on_commit: bool) -> None:
    """In a process of its own: serve the view for ``seconds``; print requests per second."""
    import django

    django.setup()
    from django.test import Client

    client = Client()
    form = {"item": "x", "on_commit": "1" if on_commit else "0"}
    for _ in range(20):  # connections, imports, the transport
        assert client.post("/orders/", form).status_code == 200
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        client.post("/orders/", form)
        done += 1
    print(json.dumps({"rps": done / (time.perf_counter() - start), "requests": done}))


def bench_view(db_url: str, rounds: int, seconds: float, brokers: set[str]) -> dict[str, Any]:
    queue = f"bench_tx_{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"], cwd=PROJECT,
                   env=view_env(db_url, "delayq", False, queue), check=True,
                   capture_output=True)
    modes = [m for m in VIEW_MODES if m[1] in brokers]
    rps: dict[str, list[float]] = {m[0]: [] for m in modes}
    for r in range(rounds):
        for name, broker, join, on_commit in (modes if r % 2 == 0 else modes[::-1]):
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", str(seconds), "--on-commit",
                 "1" if on_commit else "0"], cwd=PROJECT, capture_output=True, text=True,
                env=view_env(db_url, broker, join, queue), check=False)
            if done.returncode:
                raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
            rps[name].append(json.loads(done.stdout.strip().splitlines()[-1])["rps"])
            console.print(f"round {r + 1}/{rounds} {name}: {rps[name][-1]:.0f} requests/s")
    _purge(brokers, queue)
    return {name: {"rps": statistics.median(v), "rounds": v} for name, v in rps.items()}


# -- the docs section -----------------------------------------------------------------------


def section(data: dict[str, Any]) -> str:
    """The "Tasks in your transaction" section of docs/benchmarks.md from a results file."""
    units, view = data["units"], data["view"]
    ref = units.get("delayq publish after commit", {}).get("unit_us")
    unit_rows = [[name, f"{v['unit_us']:.0f}", f"{v['unit_p99_us']:.0f}",
                  f"{v['publish_us']:.0f}",
                  times(v['unit_us'] / ref) if ref else "-"] for name, v in units.items()]
    base = view.get("delayq on_commit", {}).get("rps")
    view_rows = [[name, f"{v['rps']:.0f}", times(v['rps'] / base) if base else "-"]
                 for name, v in view.items()]
    how = prose(f"""
One unit is an application transaction inserting one order and publishing one task for it
({data['units_per_round']:,} units per mode and round, {data['rounds']} rounds, modes
interleaved, medians of the rounds' medians). "In your transaction" writes the task in the
application's transaction (one round trip, no commit of its own); "inside (own commit)" is
delayq's normal publish made there, which escapes a rollback; "after commit" is
`transaction.on_commit`'s order, which loses the task if the process dies between the commit
and the publish. The view is the test suite's Django project serving its order view through
Django's test client, one process per mode and round, {data['view_seconds']:g} s each,
persistent database connections.""")
    return f"""## Tasks in your transaction

{run_line(data.get("command", "python bench/bench_transaction.py"), data.get("revision"),
          data.get("finished_at"), data.get("machine"))}

{markdown_table(["unit of work", "median µs", "p99 µs", "publish call µs",
                 "vs delayq after commit"], unit_rows, "lrrrr")}

{markdown_table(["Django view", "requests/s", "vs delayq on_commit"], view_rows, "lrr")}

{how}
"""


@click.command()
@database_url_option
@click.option("--rounds", default=5, show_default=True)
@click.option("--units", default=500, show_default=True, help="Units per mode and round.")
@click.option("--seconds", default=5.0, show_default=True, help="View time per mode, round.")
@click.option("--brokers", default="delayq,redis,amqp", show_default=True)
@click.option("--quick", is_flag=True, help="2 rounds, 100 units, 1 s per view run.")
@click.option("--no-docs", is_flag=True, help="Leave docs/benchmarks.md alone.")
@click.option("--child", type=float, default=None, hidden=True)
@click.option("--on-commit", default="0", hidden=True)
def main(database_url: str, rounds: int, units: int, seconds: float, brokers: str,
         quick: bool, no_docs: bool, child: float | None, on_commit: str) -> None:
    """Publishing inside the application's transaction against publishing after it."""
    if child is not None:
        serve_view(child, on_commit == "1")  # the view's own process
        return
    if quick:
        rounds, units, seconds = 2, 100, 1.0
    chosen = set(brokers.split(","))
    with fresh_database(database_url, "delayq_bench_tx") as url:
        info = machine_info(url)
        data = {"command": command_line(), "revision": git_revision(), "machine": info,
                "rounds": rounds, "units_per_round": units, "view_seconds": seconds,
                "units": bench_units(url, rounds, units, chosen),
                "view": bench_view(url, rounds, seconds, chosen)}
    name = "transaction_quick" if quick else "transaction"
    path = write_results(name, data)
    console.print(f"results: {path}")
    if not no_docs and not quick:
        replace_section("transaction", section(load_results(name)))


if __name__ == "__main__":
    main()

