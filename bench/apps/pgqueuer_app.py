"""The PgQueuer app: one ``QueueManager`` with the three tasks as entrypoints, at PgQueuer's
defaults, run through ``pgqueuer.run()`` (what ``pgq run`` does; the CLI itself fails with
today's Typer). ``BENCH_URL`` (the database, ``options=-c synchronous_commit=off`` in it for
the relaxed row), ``BENCH_OPTIONS`` (JSON: keyword arguments of each ``entrypoint``).
Its worker runs on psycopg (``PsycopgDriver``, one of its two documented drivers)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg
import report

URL = os.environ.get("BENCH_URL", "")
OPTIONS = json.loads(os.environ.get("BENCH_OPTIONS", "{}"))


def _manager(driver: Any) -> Any:
    from pgqueuer import Queries, QueueManager

    qm = QueueManager(Queries(driver))

    @qm.entrypoint("noop", **OPTIONS)
    async def noop(job: Any) -> None:
        key, total = json.loads(job.payload)
        await report.acount(key, total)

    @qm.entrypoint("timed", **OPTIONS)
    async def timed(job: Any) -> None:
        key, ident, due = json.loads(job.payload)
        await report.atimed(key, ident, due)

    @qm.entrypoint("sleepy", **OPTIONS)
    async def sleepy(job: Any) -> None:
        key, ident, seconds = json.loads(job.payload)
        await report.asleepy(key, ident, seconds)

    return qm


@asynccontextmanager
async def _factory() -> AsyncIterator[Any]:
    from pgqueuer import PsycopgDriver

    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        yield _manager(PsycopgDriver(conn))


def work() -> None:
    import pgqueuer

    asyncio.run(pgqueuer.run(_factory))


def install() -> None:
    from pgqueuer import PsycopgDriver, Queries

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
            await Queries(PsycopgDriver(conn)).install()

    asyncio.run(main())


class Sender:
    """``SyncQueries.enqueue``, one job per call; a delay as ``execute_after``."""

    def __init__(self) -> None:
        from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        self.conn = psycopg.connect(URL, autocommit=True)
        self.queries = SyncQueries(SyncPsycopgDriver(self.conn))

    def send(self, name: str, args: tuple[Any, ...], delay_s: float) -> None:
        self.queries.enqueue(name, json.dumps(args).encode(),
                             execute_after=timedelta(seconds=delay_s) if delay_s else None)

    def close(self) -> None:
        self.conn.close()


def produce_main() -> None:
    report.main(Sender)
