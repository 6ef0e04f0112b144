"""What the publish's NOTIFY costs the machine, with ``pgbench``.

The publish statement (``offer_insert`` of core/queue/queue.sql, as the queue formats it) sends no
wake- up: core/queue/announce.py sends them after the commit, coalesced. This runs it with
``pgbench`` (2 clients, prepared, ``synchronous_ commit=off`` as the consumer pool and a default
publish use) against a fresh database, once as shipped and once with a ``pg_notify`` column added
(the publish of revisions before issue 27, which notified inside its own transaction), alternately,
while one listener holds ``LISTEN`` and reads every 100 ms the way a backlogged (deaf) worker
does. Each round starts from an empty table. It prints the whole machine's CPU per insert (every
process: pgbench, the backends, the listener's backend, the WAL writer), from ``/proc/stat``.

    python bench/diagnostics/notify_cost.py --rounds 4 --inserts 10000
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common, the harness

from _common import DEFAULT_ADMIN_URL, fresh_database, machine_cpu  # noqa: E402

from delayq_transport.core.db.queries import Queries, notify_channel  # noqa: E402
from delayq_transport.core.queue import DelayedQueue  # noqa: E402

TABLE = "delayed_queue"
_PAYLOAD = "convert_to(repeat('x', 1200), 'UTF8')"  # about a Celery no-op message
#: The placeholders of offer_insert, as pgbench expressions (a random key per insert).
_VALUES = {"%(key)s": "'k' || :k", "%(kind)s": "'celery'", "%(payload)b": _PAYLOAD,
           "%(scheduled_at)s": "NULL", "%(now)s": "NULL"}
_LISTENER = """
import psycopg, sys, time
conn = psycopg.connect(sys.argv[1], autocommit=True)
conn.execute(f"LISTEN {sys.argv[2]}")
while True:
    time.sleep(0.1)
    for _ in conn.notifies(timeout=0):
        pass
"""


def scripts(directory: Path) -> dict[str, Path]:
    """pgbench scripts: the publish as shipped, and with a pg_notify column added."""
    statement = Queries(TABLE)["offer_insert"]
    for placeholder, expression in _VALUES.items():
        statement = statement.replace(placeholder, expression)
    if "%(" in statement:
        raise SystemExit(f"offer_insert has a placeholder this script does not fill: {statement}")
    channel = notify_channel(TABLE)
    noisy, found = re.subn(r'SELECT "scheduledAt",',
                           f"SELECT \"scheduledAt\", pg_notify('{channel}', "
                           "'celery:' || \"scheduledAt\"),", statement)
    if found != 1:
        raise SystemExit("offer_insert's SELECT changed shape: update this script")
    out = {}
    for name, text in (("with NOTIFY", noisy), ("without", statement)):
        path = directory / f"{name.split()[0]}.sql"
        one_line = " ".join(text.split())
        path.write_text(f"\\set k random(1, 1000000000000)\n{one_line};\n")
        out[name] = path
    return out


def one_round(url: str, script: Path, inserts: int) -> float:
    """Machine CPU µs per insert of one pgbench run on an empty table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        conn.execute("CHECKPOINT")
    env = {"PGOPTIONS": "-c synchronous_commit=off", "PATH": "/usr/bin:/bin"}
    before = machine_cpu()[0]
    subprocess.run(["pgbench", "-n", "-f", str(script), "-c", "2", "-j", "2", "-t",
                    str(inserts // 2), "-M", "prepared", "-d", url], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (machine_cpu()[0] - before) * 1e6 / inserts


@click.command()
@click.option("--admin-url", default=DEFAULT_ADMIN_URL, show_default=True,
              help="PostgreSQL URL allowed to create a scratch database.")
@click.option("--rounds", default=4, show_default=True)
@click.option("--inserts", default=20000, show_default=True, help="Inserts per run.")
def main(admin_url: str, rounds: int, inserts: int) -> None:
    with fresh_database(admin_url, "delayq_bench_notify") as url, \
            tempfile.TemporaryDirectory() as tmp:
        DelayedQueue(url, table=TABLE).close()  # the schema, triggers included
        listener = subprocess.Popen([sys.executable, "-c", _LISTENER, url,
                                     notify_channel(TABLE)])
        try:
            time.sleep(0.5)
            found: dict[str, list[float]] = {}
            runs = scripts(Path(tmp))
            for rnd in range(1, rounds + 1):
                for name, script in runs.items():
                    us = one_round(url, script, inserts)
                    found.setdefault(name, []).append(us)
                    print(f"round {rnd}: {name:12s} {us:6.1f} µs of machine CPU per insert")
        finally:
            listener.kill()
            listener.wait()
    medians = {name: statistics.median(v) for name, v in found.items()}
    print(" | ".join(f"{name}: median {m:.1f} µs" for name, m in medians.items()),
          f"| the NOTIFY: {medians['with NOTIFY'] - medians['without']:.1f} µs per publish")


if __name__ == "__main__":
    main()
