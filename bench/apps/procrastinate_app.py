"""The Procrastinate app: ``App(PsycopgConnector)`` with the three tasks, a worker from
``run_worker_async`` at its defaults but ``concurrency``; ``BENCH_URL``, ``BENCH_QUEUE``."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import procrastinate
import report

URL = os.environ.get("BENCH_URL", "")
QUEUE = os.environ.get("BENCH_QUEUE", "bench")
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))


@app.task(name="noop", queue=QUEUE)
async def noop(key: str, total: int) -> None:
    await report.acount(key, total)


@app.task(name="timed", queue=QUEUE)
async def timed(key: str, ident: int, due: float) -> None:
    await report.atimed(key, ident, due)


@app.task(name="sleepy", queue=QUEUE)
async def sleepy(key: str, ident: int, seconds: float) -> None:
    await report.asleepy(key, ident, seconds)


TASKS = {"noop": noop, "timed": timed, "sleepy": sleepy}
NAMES = {"noop": ("key", "total"), "timed": ("key", "ident", "due"),
         "sleepy": ("key", "ident", "seconds")}


def work(concurrency: int) -> None:
    async def main() -> None:
        async with app.open_async():
            await app.run_worker_async(queues=[QUEUE], concurrency=concurrency)

    asyncio.run(main())


def install() -> None:
    with app.open():
        app.schema_manager.apply_schema()


class Sender:
    """``defer`` on the app opened synchronously; a delay as ``schedule_at``."""

    def __init__(self) -> None:
        self._opened = app.open()
        self._opened.__enter__()

    def send(self, name: str, args: tuple[Any, ...], delay_s: float) -> None:
        t: Any = TASKS[name]
        if delay_s:
            t = t.configure(schedule_at=datetime.now(UTC) + timedelta(seconds=delay_s))
        t.defer(**dict(zip(NAMES[name], args, strict=True)))

    def close(self) -> None:
        self._opened.__exit__(None, None, None)


def produce_main() -> None:
    report.main(Sender)
