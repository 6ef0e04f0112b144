"""bench_scale.py's ``snapshot`` part: Celery at a steady rate with and without a held snapshot.

The same run three times: delayq on a fresh database, delayq with a REPEATABLE READ snapshot
held on that database from before the first task to after the last (what ``pg_dump`` does),
and Redis (no MVCC: the reference line). Each run:

1. a drain burst: ``drain`` no-ops queued, then a worker drains them (the drain rate at the
   start);
2. ``rate`` ``bench.lag`` tasks/s for ``minutes`` with one worker running: per ``WINDOW_S``
   window the executed rate (tasks finished in that wall-clock window) and the backlog, and
   the pick-up p50/p99 of the tasks sent in that window;
3. a second drain burst (the drain rate after ``minutes`` of churn, under the snapshot).

Trend measures per run: medians of the first and last third of the windows, and the
least-squares slope of pick-up p99 over the run in % of its median per minute. The issue's
target: drain rate and pick-up p99 of the snapshot run within 1.5x of the run without it,
with no upward trend.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from _celery import (
    BrokerRun,
    Producers,
    Settings,
    broker_state,
    counter_client,
    delayq_run,
    list_len,
    publish_paced,
    running_worker,
)
from _common import (
    TargetRow,
    at_most,
    checkpoint,
    fresh_database,
    hold_snapshot,
    markdown_table,
    median_of,
    percentile,
    prose,
    run_line,
    save_figure,
    table_stats,
    times,
)
from bench_celery import phase_drain

from delayq_transport import DelayedQueue

WINDOW_S = 10.0
TARGET_RATIO = 1.5


def _table_stats(db_url: str | None) -> dict[str, Any]:
    """The queue table's size, dead tuples and autovacuum visits (none for Redis)."""
    if db_url is None:
        return {}
    stats = table_stats(db_url)
    return {"size_mb": round((stats["table_bytes"] + stats["index_bytes"]) / 1024 / 1024, 1),
            "dead_tuples": stats["dead_tuples"], "autovacuums": stats["autovacuums"]}


def steady(run: BrokerRun, cfg: Settings, rate: float, seconds: float, progress: Any
           ) -> list[dict[str, Any]]:
    """``rate`` lag tasks/s for ``seconds``; one row per window (see the module docstring)."""
    base = f"bench_scale:{cfg.run_id}:{run.name}:{uuid.uuid4().hex[:6]}"
    n = int(rate * seconds)
    plan = [(i / rate, f"{base}:{int(i / rate // WINDOW_S)}", 0.0) for i in range(n)]
    windows = int(seconds // WINDOW_S) + 1
    keys = [f"{base}:{w}" for w in range(windows)]
    client = counter_client(cfg)
    executed: list[tuple[float, int, dict[str, Any]]] = []  # (t, tasks finished, table)
    with running_worker(run.env, f"steady-{run.name}", cfg), Producers(run.env, 1) as producers:
        bar = progress.add_task(f"{run.name}: steady {rate:.0f}/s", total=n, rate="",
                                unit="tasks")
        start = time.monotonic()
        producers.submit(publish_paced, [plan])
        deadline, seen, next_sample = start + seconds + 120, 0, start + WINDOW_S
        while time.monotonic() < deadline and seen < n and not producers.errors:
            seen = sum(list_len(client, k) for k in keys)
            progress.update(bar, completed=seen)
            if time.monotonic() >= next_sample:
                executed.append((next_sample - start, seen, _table_stats(run.db_url)))
                next_sample += WINDOW_S
            time.sleep(0.05)
        executed.append((time.monotonic() - start, seen, _table_stats(run.db_url)))
        if producers.errors:
            raise producers.errors[0]
    rows = []
    prev_t, prev_n = 0.0, 0
    for w, key in enumerate(keys):
        lags = sorted(float(v) * 1000 for v in client.lrange(key, 0, -1))
        client.delete(key)
        if w >= len(executed):
            break
        t, done, table = executed[w]
        if t - prev_t < WINDOW_S / 2:
            break  # the tail after the last full window: too short for a rate
        sent = min(n, int(rate * t))
        row: dict[str, Any] = {"t_s": w * WINDOW_S,
                               "executed_per_s": round((done - prev_n) / (t - prev_t), 1),
                               "backlog": max(0, sent - done), **table}
        prev_t, prev_n = t, done
        p50, p99 = percentile(lags, 50), percentile(lags, 99)
        if len(lags) >= 2 and p50 is not None and p99 is not None:
            row.update(n=len(lags), p50_ms=round(p50, 2), p99_ms=round(p99, 2))
        rows.append(row)
    return rows


def part_snapshot(cfg: Settings, rate: float, minutes: float, progress: Any,
                  redis_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each run: drain burst, steady load, drain burst (module docstring). ``redis_run``: the
    Redis reference line of an earlier run of the same settings, not repeated (it does not
    depend on delayq's code); the docs name its revision."""
    out: dict[str, Any] = {}
    seconds = minutes * 60
    for name, held in (("delayq", False), ("delayq_snapshot", True)):
        checkpoint(cfg.admin_url)
        with fresh_database(cfg.admin_url, prefix="delayq_bench10_snap") as db_url:
            queue = f"bench_snap_{cfg.run_id}"
            DelayedQueue(db_url, kind=queue).close()
            run = delayq_run(db_url, cfg, queue, name)
            snap = hold_snapshot(db_url) if held else None
            try:
                out[name] = _one(run, cfg, rate, seconds, progress)
            finally:
                if snap is not None:
                    snap.close()
    if redis_run is not None:
        out["redis"] = redis_run
        return out
    checkpoint(cfg.admin_url)
    with broker_state("redis", "snap", cfg) as run:
        out["redis"] = _one(run, cfg, rate, seconds, progress)
    return out


def _one(run: BrokerRun, cfg: Settings, rate: float, seconds: float, progress: Any
         ) -> dict[str, Any]:
    before = phase_drain(run, cfg, progress)
    windows = steady(run, cfg, rate, seconds, progress)
    after = phase_drain(run, cfg, progress)
    return {"drain_before": before, "windows": windows, "drain_after": after,
            "table_after": _table_stats(run.db_url)}


def _slope_pct_per_min(ws: list[dict[str, Any]], key: str) -> float | None:
    """Least-squares slope of ``key`` over time, in % of its median per minute."""
    pts = [(w["t_s"] / 60, w[key]) for w in ws if w.get(key) is not None]
    if len(pts) < 3:
        return None
    slope = statistics.linear_regression([p[0] for p in pts], [p[1] for p in pts]).slope
    med = statistics.median(p[1] for p in pts)
    return round(100 * slope / med, 2) if med else None


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    ws = run["windows"][1:]  # the first window holds the worker's warm-up
    third = max(1, len(ws) // 3)
    head, tail = ws[:third], ws[-third:]

    out: dict[str, Any] = {}
    for key in ("executed_per_s", "p50_ms", "p99_ms"):
        out[key] = {"all": median_of(ws, key), "first": median_of(head, key),
                    "last": median_of(tail, key),
                    "slope_pct_per_min": _slope_pct_per_min(ws, key)}
    out["worst_p99_ms"] = max((w.get("p99_ms") or 0 for w in ws), default=None)
    out["max_backlog"] = max((w["backlog"] for w in ws), default=0)
    for when in ("before", "after"):
        out[f"drain_{when}_per_s"] = run[f"drain_{when}"].get("tasks_per_s")
    return out


def verdict(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Snapshot vs no snapshot: ratios (drain: slower is higher) and the trend."""
    base, snap = summary.get("delayq"), summary.get("delayq_snapshot")
    if not base or not snap:
        return {}

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    out = {
        "p99_ratio_all": ratio(snap["p99_ms"]["all"], base["p99_ms"]["all"]),
        "p99_ratio_last_third": ratio(snap["p99_ms"]["last"], base["p99_ms"]["last"]),
        "executed_ratio": ratio(base["executed_per_s"]["all"], snap["executed_per_s"]["all"]),
        "drain_after_ratio": ratio(base["drain_after_per_s"], snap["drain_after_per_s"]),
        "drain_trend": ratio(snap["drain_before_per_s"], snap["drain_after_per_s"]),
        "p99_trend": ratio(snap["p99_ms"]["last"], snap["p99_ms"]["first"]),
        "p99_trend_base": ratio(base["p99_ms"]["last"], base["p99_ms"]["first"]),
    }
    ratios = [out[k] for k in ("p99_ratio_all", "p99_ratio_last_third", "executed_ratio",
                               "drain_after_ratio")]
    out["within_1_5x"] = all(r is not None and at_most(r, TARGET_RATIO) for r in ratios)
    return out


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    snap = result["snapshot"]
    panels = [("executed_per_s", "executed / s"), ("p99_ms", "pick-up p99 (ms)"),
              ("p50_ms", "pick-up p50 (ms)"), ("dead_tuples", "dead tuples (delayq)")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels)), sharex=True)
    for run_name, run in snap.items():
        ws = run["windows"]
        ts = [w["t_s"] / 60 for w in ws]
        for ax, (key, label) in zip(axes, panels, strict=True):
            if key == "dead_tuples" and run_name == "redis":
                continue
            ax.plot(ts, [w.get(key) for w in ws], label=run_name)
            ax.set_ylabel(label, fontsize=8)
            ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("minutes (snapshot held from before 0 in delayq_snapshot)")
    return save_figure(fig, path, dpi=110)


def section(data: dict[str, Any]) -> str:
    """The "Celery with a held snapshot" section of docs/benchmarks.md from a results
    document (``bench_scale.py --parts snapshot``)."""
    m = data["machine"]
    pg = m.get("postgresql", {})
    summary = {k: summarize(v) for k, v in data["snapshot"].items()}
    v = verdict(summary)
    command = data.get("command", "python bench/bench_scale.py --parts snapshot")
    server = (f"PostgreSQL {pg.get('server_version', '?')}, server `autovacuum = "
              f"{m.get('autovacuum', '?')}`{m.get('server_note', '')}")
    carried = (f" The Redis line is carried over from {data['redis_from']} (same settings and "
               "server; not re-run)." if data.get("redis_from") else "")
    how = prose(f"""
Each run: a drain burst of {data['drain_n']:,} no-ops, {data['rate']:g} tasks/s for
{data['minutes']:g} minutes, a second drain burst; the snapshot is held through all three.
Worker `-P prefork -c 2`, prefetch 4 (bench_celery's); {server}. Windows of 10 s (the first,
the worker's warm-up, left out); first / last = medians of the first and last third; slope =
least squares in % of the median per minute.{carried}""")
    rows = []
    for run_name, s in summary.items():
        rows.append([run_name, s["executed_per_s"]["all"],
                     f"{s['drain_before_per_s']} → {s['drain_after_per_s']}",
                     f"{s['p50_ms']['first']} → {s['p50_ms']['last']}",
                     f"{s['p99_ms']['first']} → {s['p99_ms']['last']}",
                     s["p99_ms"]["slope_pct_per_min"], s["worst_p99_ms"], s["max_backlog"]])
    table = markdown_table(
        ["run", "executed/s", "drain burst tasks/s before → after", "p50 ms first → last",
         "p99 ms first → last", "p99 slope %/min", "worst p99 ms", "max backlog"],
        rows, "lrrrrrrr")
    outcome = ""
    if v:
        outcome = "\n\n" + prose(
            f"Snapshot vs none: pick-up p99 {times(v['p99_ratio_all'])} over the run, "
            f"{times(v['p99_ratio_last_third'])} in the last third; executed rate "
            f"{times(v['executed_ratio'])}; drain burst after the run "
            f"{times(v['drain_after_ratio'])} slower. Trend under the snapshot: p99 last/first "
            f"third {times(v['p99_trend'])} (without: {times(v['p99_trend_base'])}), drain burst "
            f"before/after {times(v['drain_trend'])}. Within {TARGET_RATIO}×: "
            f"{'yes' if v['within_1_5x'] else '**no**'}.")
    load = (m["load_average_at_start"][0], data["load_average_at_end"][0])
    return f"""## Celery with a held snapshot

{run_line(command, data.get("revision"), data.get("finished_at"), m, load)}

{table}{outcome}

![snapshot](img/bench_{data.get("benchmark", "scale_snapshot")}.png)

{how}
"""


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """This run's row of the page's "Targets at a glance"."""
    v = verdict({k: summarize(run) for k, run in data["snapshot"].items()})
    if not v:
        return []
    return [TargetRow(
        "scale", f"a {data['minutes']:g}-minute held snapshot does not slow Celery at "
        f"{data['rate']:g} tasks/s: pick-up p99, executed rate and drain within "
        f"{TARGET_RATIO}× the run without",
        f"pick-up p99 {times(v['p99_ratio_all'])} the run without, executed rate "
        f"{times(v['executed_ratio'])}, drain after the run {times(v['drain_after_ratio'])}",
        "yes" if v["within_1_5x"] else "**no**")]
