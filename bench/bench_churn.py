"""Hours of churn and held snapshots at the core level.

Scenarios (``--scenario``):

- ``churn``: a fixed load (``--rate`` rows/s offered due now, polled and acked by two consumer
  threads as the transport does) with ``--far-rows`` far-future rows in the table, for
  ``--minutes``; rate, pick-up p99, table and index size and dead tuples sampled over time.
  The issue's one-hour run: ``flock /tmp/delayq-bench.lock python bench/bench_churn.py
  --scenario churn --minutes 60``. ``--short`` is the mode the test suite runs.
- ``snapshot``: the same load with a REPEATABLE READ snapshot held from the 5th second on, once
  per consumer variant: ``watermark`` (delayq), ``no_watermark`` (the poll from the bottom of
  the index) and ``hot_acquire`` (the alternative: an acquire that writes no indexed column).

The load itself is ``_steady.py``.

Writes ``bench/results/churn_<scenario>.json``, ``docs/img/bench_churn_<scenario>.png`` and the
``churn_<scenario>`` section of ``docs/benchmarks.md`` (``--no-docs`` skips both).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from _common import (
    DEFAULT_ADMIN_URL,
    IMG_DIR,
    TargetRow,
    at_least,
    at_most,
    checkpoint,
    command_line,
    console,
    fresh_database,
    git_revision,
    load_results,
    machine_info,
    markdown_table,
    percent,
    progress_bar,
    prose,
    run_line,
    save_figure,
    times,
    verdict,
    write_results,
)
from _steady import VARIANTS, SteadyConfig, SteadyRun, prepare, summarize
from _targets import replace_section

MB = 1024 * 1024
SNAPSHOT_AT_S = 5.0


def run_one(admin_url: str, cfg_kw: dict[str, Any], progress: Any = None) -> dict[str, Any]:
    """One steady run on a fresh database; returns its config, load time and samples."""
    checkpoint(admin_url)
    with fresh_database(admin_url, prefix="delayq_bench10_churn") as url:
        cfg = SteadyConfig(url=url, **cfg_kw)
        load_s = prepare(cfg)
        bar = None
        if progress is not None:
            bar = progress.add_task(f"{cfg.variant}", total=cfg.seconds, rate="", unit="s")

        def on_sample(s: dict[str, Any]) -> None:
            if progress is not None and bar is not None:
                progress.update(bar, completed=s["t_s"],
                                rate=f"{s['rate_per_s']:>6.0f}/s p99 {s['pickup_p99_ms']} ms "
                                     f"dead {s['dead_tuples']:,}")

        reloptions = table_reloptions(url, cfg)
        samples = SteadyRun(cfg).run(on_sample)
    return {"variant": cfg.variant, "load_far_rows_s": round(load_s, 1), "samples": samples,
            "reloptions": reloptions,
            "config": {k: v for k, v in cfg_kw.items() if k != "payload"}}


def table_reloptions(url: str, cfg: SteadyConfig) -> list[str]:
    """The queue table's per-table storage settings (migration 4's autovacuum thresholds):
    the docs name what the sizes were measured under."""
    import psycopg

    if cfg.variant == "hot_acquire":
        return []
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                           ["delayed_queue"]).fetchone()
    return list(row[0] or []) if row else []


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("rate_per_s", "executed / s"), ("pickup_p99_ms", "pick-up p99 (ms)"),
              ("poll_p50_ms", "poll p50 (ms)"), ("size_mb", "table + indexes (MB)"),
              ("dead_tuples", "dead tuples")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.1 * len(panels)), sharex=True)
    for run in runs:
        xs = [s["t_s"] / 60 for s in run["samples"]]
        for ax, (key, label) in zip(axes, panels, strict=True):
            if key == "size_mb":
                ys = [(s["table_bytes"] + s["index_bytes"]) / MB for s in run["samples"]]
            else:
                ys = [s.get(key) or 0 for s in run["samples"]]
            ax.plot(xs, ys, label=run["variant"])
            ax.set_ylabel(label, fontsize=8)
            ax.grid(alpha=0.3)
    axes[0].set_title(title, fontsize=9)
    axes[0].legend(fontsize=8)
    if any(k == "pickup_p99_ms" for k, _ in panels):
        axes[1].set_yscale("log")
        axes[2].set_yscale("log")
    axes[-1].set_xlabel("minutes")
    return save_figure(fig, path, dpi=110)


def server_text(info: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """The server the sizes depend on: version, autovacuum, the table's own settings."""
    pg = info.get("postgresql", {})
    opts = next((r.get("reloptions") for r in runs if r.get("reloptions")), None)
    text = (f"PostgreSQL {pg.get('server_version', '?')}, shared_buffers "
            f"{pg.get('shared_buffers', '?')}")
    if info.get("autovacuum"):
        text += f", server `autovacuum = {info['autovacuum']}`"
    if info.get("server_note"):
        text += f" ({info['server_note']})"
    if opts:
        text += "; queue table settings (migration 4), `autovacuum_`: " + ", ".join(
            f"`{o.removeprefix('autovacuum_')}`" for o in opts)
    return text


def table(runs: list[dict[str, Any]], window_s: float) -> str:
    rows = []
    for run in runs:
        s = summarize(run["samples"], window_s, window_s)
        rows.append([run["variant"], f"{s['rate_per_s']['first']} → {s['rate_per_s']['last']}",
                     f"{s['pickup_p99_ms']['first']} → {s['pickup_p99_ms']['last']} "
                     f"({times(s['pickup_p99_ms']['ratio'])})",
                     f"{s['poll_p99_ms']['first']} → {s['poll_p99_ms']['last']} "
                     f"({times(s['poll_p99_ms']['ratio'])})",
                     f"{s['size_mb']['first']:,.0f} → {s['size_mb']['last']:,.0f} "
                     f"(max {(s['max_table_bytes'] + s['max_index_bytes']) / MB:,.0f})",
                     f"{s['max_dead_tuples']:,}"])
    return markdown_table(["variant", "rate/s first → last", "pick-up p99 ms first → last",
                           "poll p99 ms first → last", "MB table+idx first → last",
                           "max dead tuples"],
                          rows, "lrrrrr")


@click.command()
@click.option("--scenario", type=click.Choice(["churn", "snapshot"]), default="churn",
              show_default=True)
@click.option("--minutes", type=float, default=None,
              help="Length of each run (default: churn 60, snapshot 3).")
@click.option("--rate", type=float, default=300.0, show_default=True, help="Rows offered / s.")
@click.option("--far-rows", type=int, default=None,
              help="Far-future rows loaded first (default: churn 1M, snapshot 100k).")
@click.option("--variants", default=",".join(VARIANTS), show_default=True,
              help="snapshot scenario: consumers compared.")
@click.option("--short", is_flag=True, help="The test suite's mode: 30 s, 100k far rows.")
@click.option("--docs/--no-docs", default=True, show_default=True)
@click.option("--database-url", default=DEFAULT_ADMIN_URL, show_default=True)
@click.option("--server-note", default="",
              help="How the server was set up, quoted in the docs (e.g. a throwaway cluster).")
def main(scenario: str, minutes: float | None, rate: float, far_rows: int | None, variants: str,
         short: bool, docs: bool, database_url: str, server_note: str) -> None:
    """Core-level steady load: churn over time, or held-snapshot variants compared."""
    if short:
        minutes, far_rows = minutes or 0.5, 100_000 if far_rows is None else far_rows
    minutes = minutes or (60.0 if scenario == "churn" else 3.0)
    far_rows = far_rows if far_rows is not None else (
        1_000_000 if scenario == "churn" else 100_000)
    seconds = minutes * 60
    sample_s = max(5.0, min(30.0, seconds / 40))
    base = {"seconds": seconds, "rate": rate, "far_rows": far_rows, "sample_s": sample_s}
    plan = ([{**base, "variant": "watermark"}] if scenario == "churn" else
            [{**base, "variant": v, "snapshot_at_s": SNAPSHOT_AT_S} for v in variants.split(",")])
    info = machine_info(database_url)
    import psycopg

    with psycopg.connect(database_url) as conn:  # sizes can only stay bounded if it is on
        row = conn.execute("SHOW autovacuum").fetchone()
        info["autovacuum"] = str(row[0]) if row else "?"
    info["server_note"] = server_note
    with progress_bar() as progress:
        runs = [run_one(database_url, kw, progress) for kw in plan]
    name = f"churn_{scenario}"
    info["load_average_at_end"] = list(os.getloadavg())
    window = min(600.0, seconds / 3)
    result = {"command": command_line(), "scenario": scenario, "revision": git_revision(),
              "machine": info, "runs": runs,
              "summary": {r["variant"]: summarize(r["samples"], window, window) for r in runs}}
    if short:
        console.print(table(runs, window))
        if not docs:
            import json

            print(json.dumps(result["summary"]))
            return
    path = write_results(name, result)
    console.print(f"results: {path}")
    console.print(table(runs, window))
    if docs:
        what = ("one snapshot held from 5 s on" if scenario == "snapshot" else "no snapshot")
        plot(runs, IMG_DIR / f"bench_{name}.png",
             f"{rate:.0f} rows/s, {far_rows:,} far-future rows, {what}")
        replace_section(name, section(load_results(name)))


def section(data: dict[str, Any]) -> str:
    """A "Core steady load" section of docs/benchmarks.md from a results document."""
    runs, info, scenario = data["runs"], data["machine"], data["scenario"]
    cfg = runs[0]["config"]
    seconds, sample_s = cfg["seconds"], cfg["sample_s"]
    window = min(600.0, seconds / 3)
    span = f"{window / 60:g} minutes" if window >= 60 else f"{window:g} s"
    what = "one snapshot held from 5 s on" if scenario == "snapshot" else "no snapshot"
    command = data.get("command") or (
        f"python bench/bench_churn.py --scenario {scenario} --minutes {seconds / 60:g}"
        + (" --database-url …" if info.get("server_note") else ""))
    load = (info["load_average_at_start"][0], info["load_average_at_end"][0])
    how = prose(f"""
{cfg['rate']:.0f} rows/s offered due now, polled and acked by two consumer threads as the
transport does, with {cfg['far_rows']:,} far-future rows in the table, {what}; first vs last
{span} (medians of {sample_s:g} s windows). {server_text(info, runs)}.""")
    return f"""## Core steady load: {scenario}

{run_line(command, data.get("revision"), data.get("finished_at"), info, load)}

{table(runs, window)}

![churn_{scenario}](img/bench_churn_{scenario}.png)

{how}
"""


#: The churn scenario's target: the rate of the last window within this fraction of the
#: first's, and the table with its indexes growing by at most SIZE_GROWTH.
RATE_KEPT = 0.9
SIZE_GROWTH = 1.1


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """The churn run's row of the page's "Targets at a glance" (the snapshot scenario has
    none: it measures what a held snapshot costs)."""
    if data["scenario"] != "churn":
        return []
    run = data["runs"][0]
    cfg = run["config"]
    window = min(600.0, cfg["seconds"] / 3)
    s = summarize(run["samples"], window, window)
    rate, size = s["rate_per_s"], s["size_mb"]
    ok = at_least(rate["last"] / rate["first"], RATE_KEPT) and \
        at_most(size["last"] / size["first"], SIZE_GROWTH)
    return [TargetRow(
        "scale", f"{cfg['seconds'] / 3600:g} hour of churn: rate within "
        f"{percent(1 - RATE_KEPT)}, table + indexes ≤ {times(SIZE_GROWTH)} their size",
        f"{rate['first']:,.0f} → {rate['last']:,.0f} rows/s, table + indexes "
        f"{size['first']:,.0f} → {size['last']:,.0f} MB", verdict(ok))]


if __name__ == "__main__":
    main()
