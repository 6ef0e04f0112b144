"""Who gets the CPU while a Celery benchmark runs: shares per process group, per phase.

Run it beside ``bench_celery.py --only throughput``; every 0.1 s it adds up (psutil) the CPU
time of each group of processes: the benchmark's producer processes, the worker's main
process, its pool children, PostgreSQL's backends and its auxiliary processes, RabbitMQ's
``beam.smp``, ``redis-server``. Consecutive samples are cut into phases: *publishing* while any
producer process used CPU, *tail* after it while the worker still did. For each phase of at
least 0.3 s it prints the machine's busy share and each group's share of the machine (100% =
every core busy).

Why it exists: on two shared cores the end-to-end rate is set by how much CPU the worker gets
next to the producers, not only by the CPU each task costs. Linux's autogroup scheduling
(``/proc/sys/kernel/sched_autogroup_enabled``) shares the CPU between *sessions* first, and
every PostgreSQL backend starts a session of its own (``setsid``), whereas RabbitMQ is one
process: the shares measured here show what that does to each broker's worker.

    python bench/diagnostics/cpu_shares.py --seconds 70 --waits --output /tmp/shares.json &
    python bench/bench_celery.py --only throughput --brokers delayq,amqp --no-write
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _common, the harness

from _common import machine_cpu  # noqa: E402

GROUPS = ("producer", "worker-main", "worker-child", "pg-backend", "pg-aux", "rabbitmq",
          "redis", "bench-main", "other")
_PG_AUX = ("checkpointer", "background writer", "walwriter", "autovacuum", "logical replication",
           "stats collector", "archiver")
#: Shortest phase reported, in seconds (a worker starting or stopping is not a phase).
MIN_PHASE_S = 0.3


def process_group(proc: psutil.Process, cmdline: str) -> str:
    """The group of one process, from its command line (and its parent's, for pool children)."""
    if cmdline.startswith("postgres:") or "bin/postgres " in cmdline:
        return "pg-aux" if any(a in cmdline for a in _PG_AUX) or "bin/postgres " in cmdline \
            else "pg-backend"
    if "beam.smp" in cmdline:
        return "rabbitmq"
    if "redis-server" in cmdline:
        return "redis"
    if "celery" in cmdline and "worker" in cmdline:
        try:
            parent = " ".join(proc.parent().cmdline()) if proc.parent() else ""
        except psutil.Error:
            parent = ""
        return "worker-child" if "celery" in parent and "worker" in parent else "worker-main"
    if "multiprocessing" in cmdline or "spawn_main" in cmdline:
        return "producer"
    if "bench_celery" in cmdline:
        return "bench-main"
    return "other"


@dataclass
class Sampler:
    """Per-process CPU seconds between samples, grouped (a process keeps its first group)."""

    groups: dict[int, str] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    #: Also add up each group's run-queue wait (``--waits``), from the last ``schedstat``.
    waits: bool = False
    last_wait: dict[int, float] = field(default_factory=dict)

    def sample(self) -> dict[str, float]:
        used = dict.fromkeys(GROUPS, 0.0)
        if self.waits:
            used.update(self._waits())
        seen: dict[int, float] = {}
        for proc in psutil.process_iter(["cmdline", "cpu_times"]):
            times = proc.info["cpu_times"]
            if proc.pid == os.getpid() or times is None:
                continue
            if proc.pid not in self.groups:
                self.groups[proc.pid] = process_group(proc, " ".join(proc.info["cmdline"] or ()))
            seen[proc.pid] = cpu = times.user + times.system
            used[self.groups[proc.pid]] += cpu - self.last.get(proc.pid, cpu)
        self.last = seen
        return used

    def _waits(self) -> dict[str, float]:
        """Seconds each group's threads spent runnable but waiting for a core, since the last
        sample (``/proc/<pid>/task/<tid>/schedstat``, second field, in ns)."""
        waited = {f"wait:{g}": 0.0 for g in GROUPS}
        seen: dict[int, float] = {}
        for pid, group in self.groups.items():
            total = 0.0
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                        total += int(fh.read().split()[1]) / 1e9
            except (OSError, ValueError, IndexError):
                continue
            seen[pid] = total
            waited[f"wait:{group}"] += total - self.last_wait.get(pid, total)
        self.last_wait = seen
        return waited


def _summary(state: str, rows: list[dict[str, float]]) -> dict[str, float | str] | None:
    """One phase's shares in % of the machine; None if it is too short to be one."""
    if not rows or rows[-1]["t"] - rows[0]["t"] < MIN_PHASE_S:
        return None
    total = sum(r["total"] for r in rows) or 1
    phase: dict[str, float | str] = {
        "phase": state, "from_s": rows[0]["t"], "to_s": rows[-1]["t"],
        "busy": round(100 * sum(r["busy"] for r in rows) / total, 1)}
    phase.update({g: round(100 * sum(r.get(g, 0) for r in rows) / total, 1) for g in GROUPS})
    if any(k.startswith("wait:") for k in rows[0]):
        # Run-queue waits in % of the phase's wall time (summed over a group's threads).
        wall = (total / (psutil.cpu_count() or 1)) or 1
        phase.update({f"wait:{g}": round(100 * sum(r.get(f"wait:{g}", 0) for r in rows) / wall,
                                         1) for g in GROUPS})
    return phase


def phases(rows: list[dict[str, float]]) -> list[dict[str, float | str]]:
    """Consecutive samples cut into publishing / tail phases."""
    out: list[dict[str, float | str]] = []
    current: list[dict[str, float]] = []
    state: str | None = None
    for row in rows:
        now = ("publishing" if row.get("producer", 0) > 0 else
               "tail" if row.get("worker-main", 0) + row.get("worker-child", 0) > 0 else None)
        if now != state:
            if state is not None and (done := _summary(state, current)) is not None:
                out.append(done)
            current, state = [], now
        if now is not None:
            current.append(row)
    if state is not None and (done := _summary(state, current)) is not None:
        out.append(done)
    return out


@click.command()
@click.option("--seconds", default=70.0, show_default=True, help="How long to sample.")
@click.option("--interval", default=0.1, show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), help="Write samples and phases.")
@click.option("--waits", is_flag=True,
              help="Also print each group's run-queue wait (runnable, not running) in % of the "
                   "phase's wall time, summed over its threads.")
def main(seconds: float, interval: float, output: str | None, waits: bool) -> None:
    sampler = Sampler(waits=waits)
    sampler.sample()
    busy0, total0 = machine_cpu()
    rows: list[dict[str, float]] = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(interval)
        used = sampler.sample()
        busy1, total1 = machine_cpu()
        rows.append({"t": round(time.monotonic() - start, 2), "busy": busy1 - busy0,
                     "total": total1 - total0, **used})
        busy0, total0 = busy1, total1
    found = phases(rows)
    for p in found:
        shares = " ".join(f"{g}={p[g]}" for g in GROUPS if p[g])
        span = f"{p['from_s']:6.1f}-{p['to_s']:5.1f} s"
        print(f"{p['phase']:>10} {span}  busy {p['busy']}%  {shares}")
        if waits:
            waited = " ".join(f"{g}={p[f'wait:{g}']}" for g in GROUPS if p.get(f"wait:{g}"))
            print(f"{'':>10} {'':>14}  run-queue wait, % of wall: {waited}")
    if output:
        Path(output).write_text(json.dumps({"samples": rows, "phases": found}))


if __name__ == "__main__":
    main()
