"""Failover benchmark: a primary killed under load, its standby promoted, round after round.

Runs the drill of ``tests/topology/drill.py`` (two throw-away clusters, ``pg_basebackup -R``,
a real ``celery worker`` and ``celery beat -S delayq_beat.Scheduler`` and a producer thread on
the multi-host URL with ``target_session_attrs=read-write``; ``kill -9`` of the primary's
postmaster, ``pg_ctl promote`` of the standby ``--outage`` seconds later) for each setup:

* ``sync+durable``: ``synchronous_standby_names`` names the standby, ``durable_publish`` and
  ``durable_acks`` on: what the documentation promises loses nothing;
* ``async+defaults``: asynchronous replication and delayq's default durability: the loss
  window of the defaults;
* ``async+durable`` and ``sync+defaults``: each half of the pair alone.

The producer publishes ``--rate`` per second, unpaced for the ``--burst`` seconds before the
kill (a loss grows with the rate at the kill). Per round it prints acknowledged publishes,
those lost (acknowledged by ``apply_async``, never run), the loss window (lost / the burst's
rate: how many milliseconds of publishes were lost), tasks run twice, and the recovery:
promotion -> first task run on the new primary, and -> first publish acknowledged. Raw
numbers go to ``bench/results/failover.json`` and the "Failover" section of
docs/benchmarks.md (``--no-docs``: not the page). Needs PostgreSQL's binaries
(``DELAYQ_PG_BIN``) and root or the ``postgres`` account.

    python bench/bench_failover.py [--rounds 3] [--rate 100] [--burst 0.4] [--outage 1]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))
sys.path.insert(0, str(BENCH.parent))

from _common import (  # noqa: E402
    DEFAULT_ADMIN_URL,
    command_line,
    console,
    fresh_database,
    git_revision,
    machine_info,
    markdown_table,
    prose,
    run_line,
    write_results,
)
from _targets import replace_section  # noqa: E402
from celery import Celery  # noqa: E402
from topology import clusters  # noqa: E402
from topology.drill import DrillConfig, DrillResult, run_drill  # noqa: E402

SETUPS: dict[str, tuple[bool, bool]] = {  # name: (synchronous replication, durable)
    "sync+durable": (True, True),
    "async+defaults": (False, False),
    "async+durable": (False, True),
    "sync+defaults": (True, False),
}


def one_round(setup: str, results_url: str, args: argparse.Namespace) -> dict[str, Any]:
    synchronous, durable = SETUPS[setup]
    config = DrillConfig(synchronous=synchronous, durable=durable, rate_per_s=args.rate,
                         warmup_executions=args.warmup, outage_s=args.outage,
                         after_s=args.after, burst_s=args.burst, drain_timeout_s=180)
    root = clusters.scratch_root()
    logs = Path(tempfile.mkdtemp(prefix="delayq-failover-logs-"))
    app = Celery("bench-failover", set_as_current=False)
    app.conf.task_default_queue = "celery"
    try:
        result = run_drill(root, results_url, config, logs, app)
    finally:
        if app._pool is not None:
            app._pool.force_close_all()
        if app.amqp._producer_pool is not None:
            app.amqp._producer_pool.force_close_all()
        app.close()
        shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)
    return summary(setup, result)


def summary(setup: str, result: DrillResult) -> dict[str, Any]:
    rate = result.burst_rate_per_s
    return {
        "setup": setup,
        "acknowledged": len(result.acknowledged),
        "lost": len(result.lost),
        "lost_ids": result.lost[:50],
        "lost_window_ms": round(1000 * len(result.lost) / rate, 1) if rate else None,
        "burst_rate_per_s": round(rate),
        "duplicated": len(result.duplicated),
        "failed_publishes": result.failed_publishes,
        "duplicate_ticks": len(result.duplicate_ticks),
        "ticks_after_promotion": result.ticks_after_promotion,
        "recovery_s": result.recovery_s,
        "publish_recovery_s": result.publish_recovery_s,
        "same_worker": result.worker_alive and result.worker_pids == {result.worker_pid},
    }


def report(rounds: list[dict[str, Any]]) -> str:
    rows = []
    for setup in SETUPS:
        mine = [r for r in rounds if r["setup"] == setup]
        if not mine:
            continue
        recov = [r["recovery_s"] for r in mine if r["recovery_s"] is not None]
        pub = [r["publish_recovery_s"] for r in mine if r["publish_recovery_s"] is not None]
        rows.append([
            setup, len(mine),
            ", ".join(f"{r['lost']}/{r['acknowledged']}" for r in mine),
            ", ".join("-" if r["lost_window_ms"] is None else f"{r['lost_window_ms']:.0f}"
                      for r in mine),
            ", ".join(str(r["duplicated"]) for r in mine),
            f"{statistics.median(recov):.2f} ({min(recov):.2f}-{max(recov):.2f})" if recov
            else "-",
            f"{statistics.median(pub):.2f}" if pub else "-",
            "yes" if all(r["same_worker"] for r in mine) else "no",
        ])
    return markdown_table(
        ["setup", "rounds", "lost / acknowledged", "loss window (ms of publishes)",
         "run twice", "recovery s: median (range)", "first publish s", "same worker"],
        rows, "lrrrrrrl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0,
                        help="publishes per second, but for the unpaced burst before the kill")
    parser.add_argument("--burst", type=float, default=0.4,
                        help="seconds of unpaced publishing right before the kill (< 0.6)")
    parser.add_argument("--warmup", type=int, default=200, help="tasks run before the kill")
    parser.add_argument("--outage", type=float, default=1.0, help="kill -> promote, seconds")
    parser.add_argument("--after", type=float, default=3.0, help="publishing after promotion")
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL)
    parser.add_argument("--no-write", action="store_true", help="only print")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md alone")
    args = parser.parse_args()
    # A stopped run still stops its clusters and processes (the drill's finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # The producer's pool and retries report every failed reconnect of the outage: expected.
    for name in ("psycopg.pool", "delayq_transport"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    reason = clusters.available()
    if reason:
        sys.exit(f"cannot start throw-away clusters: {reason}")
    rounds: list[dict[str, Any]] = []
    with fresh_database(args.admin_url, "delayq_bench_failover") as results_url:
        for n in range(args.rounds):
            for setup in args.setups:  # interleaved: every setup sees the same machine load
                row = one_round(setup, results_url, args)
                rounds.append(row)
                console.print(f"round {n + 1} {setup}: {row['lost']}/{row['acknowledged']} "
                              f"lost (burst {row['burst_rate_per_s']}/s before the kill), "
                              f"{row['duplicated']} run twice, recovery "
                              f"{row['recovery_s']} s, first publish "
                              f"{row['publish_recovery_s']} s")
        machine = machine_info(results_url)
    table = report(rounds)
    console.print(table)
    if not args.no_write:
        data = {"command": command_line(), "revision": git_revision(), "machine": machine,
                "rate_per_s": args.rate, "outage_s": args.outage, "rounds": rounds,
                "table": table}
        path = write_results("failover", data)
        console.print(f"wrote {path}")
        if not args.no_docs:
            replace_section("failover", section(data))


def section(data: dict[str, Any]) -> str:
    """The "Failover" section of docs/benchmarks.md, from ``failover.json`` alone."""
    command = data.get("command") or "python bench/bench_failover.py"
    how = prose(f"""A primary killed (`kill -9` of its postmaster) under load and its standby
promoted {data.get("outage_s", 1):g} s later, rounds of the setups interleaved: a real `celery
worker`, `celery beat -S delayq_beat.Scheduler` and a producer thread on the multi-host URL
with `target_session_attrs=read-write`. The producer publishes {data.get("rate_per_s", 100):g}/s,
unpaced for the 0.4 s before the kill. *Lost*: acknowledged by `apply_async`, never run; *loss
window*: lost / the publishing rate at the kill; *run twice*: tasks executed twice; *recovery*:
promotion to the first task run on the promoted standby. Setups: `sync` or `async` replication
(`synchronous_standby_names` naming the standby or not), `durable` (the transport options
`durable_publish` and `durable_acks`) or the `defaults`. The primary and standby flush for real
(`fsync = on`).""")
    head = run_line(command, data.get("revision"), data.get("finished_at"), data.get("machine"))
    return f"## Failover\n\n{head}\n\n{report(data['rounds'])}\n\n{how}"

if __name__ == "__main__":
    main()
