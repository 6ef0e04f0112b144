"""Beat benchmark: 1,000 entries with a one-minute crontab.

delayq_beat (refresh every 60 s, 1 h horizon) against Celery's PersistentScheduler publishing
the same schedule through the delayq transport. For each: statements sent (counted on the
client by wrapping psycopg's cursor) and transactions committed (``pg_stat_database``) per
minute of schedule, time per refresh / per minute of publishing, and rows in the table.

delayq_beat runs on an injected clock, so "a minute later" needs no waiting; the
PersistentScheduler run makes every entry due once (one minute's worth) and ticks until all
1,000 are published. Usage: ``python bench/bench_beat.py [--entries 1000] [--minutes 5]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from _common import (
    DEFAULT_ADMIN_URL,
    TargetRow,
    command_line,
    console,
    fresh_database,
    git_revision,
    load_results,
    machine_info,
    markdown_table,
    progress_bar,
    prose,
    run_line,
    write_results,
)
from _targets import replace_section

from delayq_beat import BeatStore, Installer, Settings, make_spec
from delayq_transport import DelayedQueue


class StatementCounter:
    """Counts statements this process sends, by wrapping psycopg's Cursor.execute."""

    def __init__(self) -> None:
        self.count = 0
        self._orig = psycopg.Cursor.execute

    def install(self) -> None:
        orig, counter = self._orig, self

        def execute(cur: psycopg.Cursor, *args: Any, **kwargs: Any) -> Any:
            counter.count += 1
            return orig(cur, *args, **kwargs)

        psycopg.Cursor.execute = execute  # type: ignore[method-assign,assignment]


def xact_commits(url: str) -> int:
    """Committed transactions of the bench database (stats are flushed about once a second)."""
    time.sleep(1.2)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0]) - 2  # this probe's own transactions


@contextmanager
def measured(url: str, counter: StatementCounter) -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    x0, s0 = xact_commits(url), counter.count
    t0 = time.perf_counter()
    yield out
    out["seconds"] = time.perf_counter() - t0
    out["statements"] = counter.count - s0
    out["transactions"] = xact_commits(url) - x0


def row_count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM delayed_queue").fetchone()
    assert row is not None
    return int(row[0])


def bench_delayq_beat(url: str, entries: int, minutes: int, counter: StatementCounter,
                      advance: Callable[[], None] | None = None) -> dict[str, Any]:
    from celery.schedules import crontab

    now = [datetime.now(UTC).replace(second=30, microsecond=0)]
    queue = DelayedQueue(url, kind="celery", clock=lambda: now[0])
    inst = Installer(queue, BeatStore(queue.db), ZoneInfo("UTC"), Settings())
    specs = {f"entry_{i:04d}": make_spec(f"entry_{i:04d}", "tasks.report", crontab(),
                                         args=(i,))
             for i in range(entries)}
    result: dict[str, Any] = {}
    with progress_bar() as progress:
        task = progress.add_task("delayq_beat refreshes", total=minutes + 2, rate="",
                                 unit="refreshes")
        with measured(url, counter) as first:
            inst.refresh(specs)
        result["first_refresh"] = first
        progress.advance(task)
        with measured(url, counter) as noop:
            inst.refresh(specs)
        result["noop_refresh"] = noop
        restarted = Installer(queue, BeatStore(queue.db), ZoneInfo("UTC"), Settings())
        with measured(url, counter) as restart:
            restarted.refresh(specs)  # a beat restart: re-offers the horizon, batched
        result["restart_refresh"] = restart
        progress.advance(task)
        steady = []
        for _ in range(minutes):
            now[0] += timedelta(minutes=1)
            with queue.db.transaction() as conn:  # the workers consumed the minute's ticks
                conn.execute('DELETE FROM delayed_queue WHERE "scheduledAt" <= %s',
                             (int(now[0].timestamp() * 1000),))
            with measured(url, counter) as m:
                inst.refresh(specs)
            steady.append(m)
            progress.advance(task)
    result["steady_refresh"] = {k: sum(m[k] for m in steady) / len(steady)
                                for k in ("seconds", "statements", "transactions")}
    result["rows_at_steady_state"] = row_count(url)
    queue.close()
    return result


def bench_persistent(url: str, entries: int, counter: StatementCounter) -> dict[str, Any]:
    """Celery's PersistentScheduler publishing one minute's worth (every entry due once)."""
    from celery import Celery
    from celery.beat import PersistentScheduler
    from celery.schedules import crontab

    import delayq_transport.transport  # noqa: F401  (registers delayq+postgresql://)

    app = Celery("bench_beat", broker="delayq+" + url, set_as_current=False)
    app.conf.beat_schedule = {f"entry_{i:04d}": {"task": "tasks.report", "schedule": crontab(),
                                                 "args": (i,)} for i in range(entries)}
    with tempfile.TemporaryDirectory() as tmp:
        sched = PersistentScheduler(app, schedule_filename=str(Path(tmp) / "sched"))
        past = datetime.now(UTC) - timedelta(minutes=2)
        for entry in sched.schedule.values():
            entry.last_run_at = past
        sched._heap = None
        sched.tick()  # connect and warm up outside the measurement
        published = 1
        with progress_bar() as progress, measured(url, counter) as m:
            task = progress.add_task("PersistentScheduler publishes", total=entries, rate="",
                                     unit="tasks")
            while published < entries:
                if sched.tick() == 0:
                    published += 1
                    progress.update(task, completed=published)
        sched.close()
    return {"one_minute_of_publishing": m, "rows_at_steady_state": row_count(url)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=5)
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL)
    args = parser.parse_args()
    counter = StatementCounter()
    counter.install()
    with fresh_database(args.admin_url, "delayq_bench_beat") as url:
        info = machine_info(url)
        ours = bench_delayq_beat(url, args.entries, args.minutes, counter)
    with fresh_database(args.admin_url, "delayq_bench_beat") as url:
        theirs = bench_persistent(url, args.entries, counter)
    data = {"command": command_line(), "revision": git_revision(), "entries": args.entries,
            "schedule": "crontab() (every minute)",
            "delayq_beat": ours, "persistent_scheduler": theirs, "machine": info,
            "settings": {"refresh_interval_s": 60, "horizon_s": 3600}}
    write_results("beat", data)
    replace_section("beat", section(load_results("beat")))
    console.print(data)


def section(data: dict[str, Any]) -> str:
    """The "Beat" section of docs/benchmarks.md from a results document."""
    ours, theirs = data["delayq_beat"], data["persistent_scheduler"]["one_minute_of_publishing"]
    steady, first = ours["steady_refresh"], ours["first_refresh"]
    rows = [
        ["delayq_beat, first install ever (1 h ahead, per entry)", f"{first['seconds']:.2f}",
         f"{first['statements']:.0f}", f"{first['transactions']:.0f}", "-"],
        ["delayq_beat, first refresh after a restart", f"{ours['restart_refresh']['seconds']:.2f}",
         f"{ours['restart_refresh']['statements']:.0f}",
         f"{ours['restart_refresh']['transactions']:.0f}", "-"],
        ["delayq_beat, steady refresh (= per minute)", f"{steady['seconds']:.3f}",
         f"{steady['statements']:.0f}", f"{steady['transactions']:.0f}",
         f"{ours['rows_at_steady_state']:,}"],
        ["delayq_beat, refresh with nothing new", f"{ours['noop_refresh']['seconds']:.3f}",
         f"{ours['noop_refresh']['statements']:.0f}",
         f"{ours['noop_refresh']['transactions']:.0f}", "-"],
        ["Celery PersistentScheduler via delayq transport, per minute",
         f"{theirs['seconds']:.2f}", f"{theirs['statements']:.0f}",
         f"{theirs['transactions']:.0f}",
         f"{data['persistent_scheduler']['rows_at_steady_state']:,}"],
    ]
    table = markdown_table(["run", "seconds", "statements", "transactions", "rows in table"],
                           rows, "lrrrr")
    command = data.get("command", "python bench/bench_beat.py")
    how = prose(f"""
{data['entries']:,} one-minute crontabs: delayq_beat with its defaults (refresh every 60 s, 1 h
horizon) against Celery's PersistentScheduler publishing the same schedule through delayq.
Statements counted on the client, transactions from `pg_stat_database`; a steady refresh runs
once a minute, so its row is the load per minute, whatever the number of entries. The price is
the rows kept ahead (entries × occurrences in the horizon).""")
    return f"""## Beat

{run_line(command, data.get("revision"), data.get("finished_at"), data.get("machine"))}

{table}

{how}
"""


if __name__ == "__main__":
    main()


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """This run's row of the page's "Targets at a glance": a measurement without a target."""
    steady = data["delayq_beat"]["steady_refresh"]
    theirs = data["persistent_scheduler"]["one_minute_of_publishing"]
    return [TargetRow("beat", f"load per refresh with {data['entries']:,} one-minute crontabs",
                      f"{steady['statements']:.0f} statements per minute (PersistentScheduler: "
                      f"{theirs['statements']:.0f})", "-")]
