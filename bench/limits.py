"""A concurrency limit held by delayq and by the peers that have one (issue 52): is it held
exactly, and what does holding it cost the database? Each system gets a fresh database on
bench/counted.py's throwaway cluster (``pg_stat_statements`` preloaded), ``n`` tasks of
``task_ms`` enqueued first (not measured), then ``workers`` processes drain them under the limit.
Each task appends its start and end to a file (not the database: the record costs no statement).
Figures: ``max_running`` (the most tasks running at once, as the tasks saw it: held when at
most ``limit``), per task ``statements``, ``round_trips``, ``rows``, ``buffers``, ``wal_bytes``
(counted.py's ``Meter``, workers' start to exit), ``wall_s`` (to the last task's end; the floor
is ``n * task_ms / limit``; noisy on a shared machine: ``load_1m``).

* ``delayq``: ``DelayedQueue.limit(kind, concurrency=N)``; each process polls 1 at a time, acks
  and wakes the claimers (as the Session does), held back waits for ``retry_at`` (<= 50 ms);
* ``pgqueuer``: PgQueuer 1.6, ``@qm.entrypoint(concurrency_limit=N)`` (enforced in SQL across
  workers), ``QueueManager.run(mode=drain)`` at its defaults on its psycopg driver, whose LISTEN
  reader holds the one connection up to 1 s at a time; ``pgqueuer-asyncpg`` on asyncpg;
* ``procrastinate-lock``: Procrastinate 3.10 limits running only to 1, as jobs of one ``lock``
  (its ``queueing_lock`` caps *waiting* jobs); ``--limit 1`` only; at its defaults (a poll every
  5 s) and with 50 ms polls (``procrastinate-lock-poll``).

Peers need a venv with ``--system-site-packages`` and ``pip install pgqueuer==1.6.0 asyncpg
'procrastinate==3.10.*'``; django-ox (Python 3.12) is not here.

    PYTHONPATH=$PWD python bench/limits.py --systems delayq pgqueuer pgqueuer-asyncpg
    PYTHONPATH=$PWD python bench/limits.py --limit 1 --n 100 --systems delayq \
        procrastinate-lock procrastinate-lock-poll
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from counted import Meter, Relay, cluster  # noqa: E402
from records import machine, now, revision, save  # noqa: E402

KIND = "limited"
#: The longest a held-back delayq worker waits before claiming again (the core's RETRY_MS).
MAX_WAIT_S = 0.05


def record_run(log: str, start: float, end: float) -> None:
    """One task's start and end in one write (atomic under O_APPEND)."""
    with open(log, "a") as f:
        f.write(f"{start:.6f} {end:.6f}\n")


def runs_of(log: str) -> list[tuple[float, float]]:
    text = Path(log).read_text() if os.path.exists(log) else ""
    return [(float(a), float(b)) for a, b in (line.split() for line in text.splitlines())]


def max_overlap(runs: list[tuple[float, float]]) -> int:
    """The most runs open at once (an end at the same instant as a start comes first)."""
    events = sorted([(s, 1) for s, _ in runs] + [(e, -1) for _, e in runs])
    best = running = 0
    for _, step in events:
        running += step
        best = max(best, running)
    return best


def delayq_setup(url: str, n: int, limit: int) -> None:
    from delayq_transport import DelayedQueue

    with DelayedQueue(url, kind=KIND) as q:  # migrates the fresh database
        q.offer_batch([(f"t{i}", b"{}", None) for i in range(n)])
        q.limit(KIND, concurrency=limit)


def delayq_worker(url: str, log: str, n: int, task_s: float, limit: int) -> None:
    """Claim one at a time until the log holds ``n`` runs."""
    from delayq_transport import DelayedQueue

    with DelayedQueue(url, kind=KIND, ensure_schema=False, pool_max_size=1) as q:
        while len(runs_of(log)) < n:
            envs, retry_at = q.poll(1)
            if not envs:
                wait = MAX_WAIT_S if retry_at is None else retry_at / 1000 - time.time()
                time.sleep(min(max(wait, 0.001), MAX_WAIT_S))
                continue
            for env in envs:
                start = time.time()
                time.sleep(task_s)
                record_run(log, start, time.time())
                q.ack(env)
            q.wake_claimers(q.controlled([KIND]))


def pgqueuer_setup(url: str, n: int, limit: int) -> None:
    from pgqueuer import PsycopgDriver, Queries

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            queries = Queries(PsycopgDriver(conn))
            await queries.install()
            await queries.enqueue([KIND] * n, [b"{}"] * n, [0] * n)

    asyncio.run(main())


def pgqueuer_worker(url: str, log: str, n: int, task_s: float, limit: int,
                    driver: str = "psycopg") -> None:
    """A ``QueueManager`` in drain mode: exits once the queue is empty and its tasks done."""
    from pgqueuer import Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    async def run(qm: Any) -> None:
        @qm.entrypoint(KIND, concurrency_limit=limit)
        async def limited(job: Any) -> None:
            start = time.time()
            await asyncio.sleep(task_s)
            record_run(log, start, time.time())

        await qm.run(mode=QueueExecutionMode.drain)

    async def main() -> None:
        if driver == "asyncpg":
            import asyncpg
            from pgqueuer import AsyncpgDriver

            conn = await asyncpg.connect(url)
            await run(QueueManager(Queries(AsyncpgDriver(conn))))
            return await conn.close()
        from pgqueuer import PsycopgDriver

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
            await run(QueueManager(Queries(PsycopgDriver(aconn))))

    asyncio.run(main())


def _procrastinate_app(url: str, log: str = "", task_s: float = 0.0) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name=KIND, queue=KIND)
    async def limited() -> None:
        start = time.time()
        await asyncio.sleep(task_s)
        record_run(log, start, time.time())

    return app, limited


def procrastinate_setup(url: str, n: int, limit: int) -> None:
    """Every job under one ``lock``: Procrastinate runs the jobs of a lock one at a time."""
    if limit != 1:
        raise ValueError("Procrastinate's lock holds 1 at a time: run it with --limit 1")

    async def main() -> None:
        app, limited = _procrastinate_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for _ in range(n):
                await limited.configure(lock=KIND).defer_async()

    asyncio.run(main())


def procrastinate_worker(url: str, log: str, n: int, task_s: float, limit: int,
                         poll_s: float | None = None) -> None:
    options = {} if poll_s is None else {"fetch_job_polling_interval": poll_s}

    async def main() -> None:
        app, _ = _procrastinate_app(url, log, task_s)
        async with app.open_async():
            worker = asyncio.create_task(app.run_worker_async(queues=[KIND], concurrency=3,
                                                              **options))
            while len(runs_of(log)) < n and not worker.done():  # the file, not the database
                await asyncio.sleep(0.05)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    asyncio.run(main())


Worker = Callable[[str, str, int, float, int], None]
SYSTEMS: dict[str, tuple[str, Callable[[str, int, int], None], Worker, str]] = {
    "delayq": ("delayq", delayq_setup, delayq_worker, "poll(1), ack, wake the claimers"),
    "pgqueuer": ("PgQueuer 1.6", pgqueuer_setup, pgqueuer_worker, "psycopg driver, defaults"),
    "pgqueuer-asyncpg": ("PgQueuer 1.6, asyncpg", pgqueuer_setup,
                         functools.partial(pgqueuer_worker, driver="asyncpg"), "asyncpg driver"),
    "procrastinate-lock": ("Procrastinate 3.10, lock", procrastinate_setup, procrastinate_worker,
                           "one lock, concurrency=3 a process, defaults (5 s polls)"),
    "procrastinate-lock-poll": ("Procrastinate 3.10, lock, 50 ms polls", procrastinate_setup,
                                functools.partial(procrastinate_worker, poll_s=0.05),
                                "one lock, fetch_job_polling_interval=0.05"),
}


def measure(system: str, port: int, relay: Relay, n: int, task_ms: int, workers: int,
            limit: int, folder: Path) -> dict[str, Any]:
    """One system in its own fresh database: its figures."""
    _, setup, worker, _ = SYSTEMS[system]
    dbname = f"limits_{system}"
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}"')
        conn.execute(f'CREATE DATABASE "{dbname}"')
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    url = f"postgresql://postgres@127.0.0.1:{relay.port}/{dbname}?sslmode=disable"
    setup(url, n, limit)
    log = str(folder / f"{system}.runs")
    meter = Meter(port, relay, dbname, names={"": ""})
    figures: dict[str, Any] = {}
    spawn = multiprocessing.get_context("spawn")
    with meter.measure(n, figures):
        began = time.time()
        procs = [spawn.Process(target=worker, args=(url, log, n, task_ms / 1000, limit),
                               name=f"{system}-{i}") for i in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=max(600.0, 20 * n * task_ms / 1000 / limit))
            if p.is_alive():  # stuck: counted in workers_failed
                p.terminate()
                p.join(10)
    meter.conn.close()
    runs = runs_of(log)
    for extra in ("by_statement", "tasks"):
        figures.pop(extra, None)
    figures.update(
        max_running=max_overlap(runs), limit=limit, tasks_run=len(runs),
        wall_s=round(max((e for _, e in runs), default=began) - began, 3),
        floor_s=round(n * task_ms / 1000 / limit, 3), load_1m=round(os.getloadavg()[0], 2),
        workers_failed=sum(p.exitcode != 0 for p in procs))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", nargs="+", default=["delayq"], choices=list(SYSTEMS))
    parser.add_argument("--n", type=int, default=300, help="tasks (default 300)")
    parser.add_argument("--task-ms", type=int, default=50, help="each task's run (default 50)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--limit", type=int, default=3, help="the limit (default 3)")
    parser.add_argument("--no-save", action="store_true", help="print only")
    args = parser.parse_args()
    shown = "python bench/limits.py " + " ".join(sys.argv[1:])
    records = []
    with cluster() as port, tempfile.TemporaryDirectory(prefix="delayq-limits-") as tmp:
        relay = Relay(port)
        about = machine(f"postgresql://postgres@127.0.0.1:{port}/postgres")
        for system in args.systems:
            title, _, _, config = SYSTEMS[system]
            record: dict[str, Any] = {
                "system": system, "scenario": f"concurrency limit {args.limit}",
                "revision": revision(), "round": 1, "command": shown.strip(), "date": now(),
                "settings": {"title": title, "config": config},
                "params": {"n": args.n, "task_ms": args.task_ms, "workers": args.workers,
                           "limit": args.limit},
                "machine": about}
            try:
                record["figures"] = measure(system, port, relay, args.n, args.task_ms,
                                            args.workers, args.limit, Path(tmp))
            except Exception as exc:  # a peer that fails is a row saying why, not a crash
                record["error"] = f"{type(exc).__name__}: {exc}"
            records.append(record)
    print(table(records))
    if not args.no_save:
        print(f"wrote {save('limits', records)}")
    return 0


COLUMNS = ("max_running", "limit", "tasks_run", "statements", "round_trips", "rows", "buffers",
           "wal_bytes", "wall_s", "floor_s", "load_1m")


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| system | " + " | ".join(COLUMNS) + " |",
             "| --- |" + " ---: |" * len(COLUMNS)]
    for r in records:
        cells = (["error: " + r["error"]] if "error" in r else
                 [json.dumps(r["figures"].get(c)) for c in COLUMNS])
        lines.append(f"| {r['settings']['title']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
