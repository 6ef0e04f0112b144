"""Celery at scale: delayq with millions of waiting rows and with a held
snapshot, next to the same Celery workload on Redis (no MVCC: the reference line).

Parts (``--parts``):

- ``sizes``: far-future rows (one month ahead, in the consumed queue itself) are topped up to
  each of ``--sizes`` with generate_series; at each size, ``--drain`` no-op tasks are queued,
  then one worker (``-P prefork -c 2``, as bench_celery) drains them (rate), then a short
  steady run measures pick-up latency. Redis runs the same drain and latency once.
  **Paired drains:** a reference database holding the smallest size is drained back to back
  with the measured one, ``--rounds`` times, in alternating order, and the ratio is the median
  big drain over the median reference drain of the same minutes. A single drain of a few
  seconds on this shared 2-core machine varies by 30-40 % from one minute to the next (the
  same table: 6.4, 9.0, 8.2 s), so an unpaired ratio cannot resolve a 1.1x target; the smallest
  size's own ratio shows the noise left. Before every drain: rows of earlier phases that a
  killed worker left leased are deleted (counted in the results), and a CHECKPOINT, so no
  drain pays another's dirty pages or full-page images.
- ``snapshot``: a steady ``--rate`` tasks/s of ``bench.lag`` for ``--minutes``; pick-up p50/p99
  and executed count per 10 s window, for delayq without and with a REPEATABLE READ snapshot
  held the whole time, and for Redis.

- ``ab`` (with ``--ab REV``): the drain at the largest of ``--sizes`` by this checkout and by
  revision ``REV`` (bench/_variants.py: the worker and producers import ``REV``'s library),
  each on its own database holding the same far-future rows, its schema made by its own
  revision; ``--rounds`` drains per side in alternating order. The ratio is this checkout's
  median drain time over ``REV``'s (below 1: faster). Writes ``bench/results/scale_ab.json``
  and the ``scale_ab`` section.

Writes ``bench/results/scale.json``, ``docs/img/bench_scale_*.png`` and the ``scale`` section of
``docs/benchmarks.md`` (the snapshot part, ``_scale_snapshot.py``: ``scale_snapshot``). Hold
the bench lock: ``flock /tmp/delayq-bench.lock python bench/bench_scale.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import _scale_snapshot as snapshot
import click
import psycopg
from _celery import BrokerRun, Settings, broker_state, delayq_run
from _common import (
    DEFAULT_ADMIN_URL,
    IMG_DIR,
    TABLE,
    TargetRow,
    at_most,
    checkpoint,
    command_line,
    console,
    fmt_rate,
    fresh_database,
    git_revision,
    handle_stop_signals,
    load_far_rows,
    load_results,
    machine_info,
    markdown_table,
    progress_bar,
    prose,
    run_line,
    times,
    vacuum_analyze,
    verdict,
    write_results,
)
from _targets import replace_section
from _variants import parse, source_tree, tree_env
from bench_celery import phase_drain, phase_latency

from delayq_transport import DelayedQueue

WINDOW_S = 10.0


def _drain(run: BrokerRun, cfg: Settings, queue: str, progress: Any) -> dict[str, Any]:
    """One drain after the same preparation whatever the size: leftovers of earlier phases
    (rows a killed worker left leased; never the far-future rows) deleted, then a CHECKPOINT."""
    assert run.db_url is not None
    with psycopg.connect(run.db_url, autocommit=True) as conn:
        cur = conn.execute(
            'DELETE FROM delayed_queue WHERE "pKind" = %s AND "scheduledAt" < '
            "(extract(epoch FROM now()) * 1000)::bigint + 86400000", (queue,))
        leftovers = cur.rowcount
    checkpoint(cfg.admin_url)
    return {**phase_drain(run, cfg, progress), "leftovers_deleted": leftovers}


def part_sizes(cfg: Settings, sizes: list[int], rounds: int, progress: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"delayq": [], "redis": None, "rounds": rounds}
    queue = f"bench_scale_{cfg.run_id}"
    with fresh_database(cfg.admin_url, prefix="delayq_bench10_scale") as db_url, \
            fresh_database(cfg.admin_url, prefix="delayq_bench10_ref") as ref_url:
        for url in (db_url, ref_url):
            DelayedQueue(url, kind=queue).close()  # schema
        load_far_rows(ref_url, queue, sizes[0])
        loaded = 0
        for size in sizes:
            load_s = load_far_rows(db_url, queue, size - loaded, first=loaded)
            loaded = size
            big, ref = delayq_run(db_url, cfg, queue, f"delayq_{size}"), \
                delayq_run(ref_url, cfg, queue, f"delayq_ref_{size}")
            drains: dict[str, list[dict[str, Any]]] = {"big": [], "ref": []}
            for r in range(rounds):
                for which in (("ref", "big") if r % 2 == 0 else ("big", "ref")):
                    drains[which].append(_drain(big if which == "big" else ref, cfg, queue,
                                                progress))
            latency = phase_latency(big, cfg, progress)
            med = {k: round(statistics.median(d.get("seconds") or 0 for d in v), 3)
                   for k, v in drains.items()}
            entry = {"far_rows": size, "load_s": round(load_s, 1), "drains": drains,
                     "drain_s": med["big"], "ref_drain_s": med["ref"],
                     "ratio": round(med["big"] / med["ref"], 3) if med["ref"] else None,
                     "latency": _strip(latency)}
            out["delayq"].append(entry)
            console.print(f"delayq {size:,}: drain {med['big']} s vs reference {med['ref']} s "
                          f"({entry['ratio']}x), p99 {latency['immediate'].get('p99_ms')} ms")
    checkpoint(cfg.admin_url)
    with broker_state("redis", "scale", cfg) as run:
        out["redis"] = {"drain": phase_drain(run, cfg, progress),
                        "latency": _strip(phase_latency(run, cfg, progress))}
    return out


def _make_schema(url: str, queue: str, env: dict[str, str]) -> None:
    """The schema of ``url`` made by the library ``env`` imports (a revision's own migrations:
    an older revision must not meet a schema newer than it knows)."""
    code = ("import sys; from delayq_transport import DelayedQueue; "
            "DelayedQueue(sys.argv[1], kind=sys.argv[2]).close()")
    subprocess.run([sys.executable, "-c", code, url, queue], env=env, check=True)


def part_ab(cfg: Settings, size: int, rev: str, rounds: int, progress: Any) -> dict[str, Any]:
    """This checkout's drain against ``rev``'s, each over ``size`` far-future rows, rounds
    interleaved (the order alternates, so neither side always drains right after a load)."""
    queue = f"bench_scale_{cfg.run_id}"
    sides = {f"delayq@{rev}": rev, "delayq": None}
    drains: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    loads: dict[str, float] = {}
    with fresh_database(cfg.admin_url, prefix="delayq_bench_scale_ab_a") as url_a, \
            fresh_database(cfg.admin_url, prefix="delayq_bench_scale_ab_b") as url_b:
        runs = {}
        for (name, side_rev), url in zip(sides.items(), (url_a, url_b), strict=True):
            run = delayq_run(url, cfg, queue, name.replace("@", "_at_"))
            if side_rev is not None:
                assert parse(name) is not None
                run = dataclasses.replace(run, env=tree_env(run.env, source_tree(side_rev)))
            _make_schema(url, queue, run.env)
            loads[name] = round(load_far_rows(url, queue, size), 1)
            # Now, not by autovacuum in the middle of some drain: the insert-triggered vacuum
            # of millions of fresh rows would land on whichever side it happens to meet.
            vacuum_analyze(url, TABLE)
            runs[name] = run
        checkpoint(cfg.admin_url)
        names = list(sides)
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                drains[name].append(_drain(runs[name], cfg, queue, progress))
                console.print(f"round {r + 1} {name}: {drains[name][-1].get('seconds')} s")
    med = {name: round(statistics.median(d.get("seconds") or 0 for d in v), 3)
           for name, v in drains.items()}
    base, ours = med[names[0]], med[names[1]]
    return {"far_rows": size, "rev": rev, "rounds": rounds, "load_s": loads, "drains": drains,
            "median_s": med, "ratio": round(ours / base, 3) if base else None}


def _strip(latency: dict[str, Any]) -> dict[str, Any]:
    return {k: ({kk: vv for kk, vv in v.items() if kk != "samples_ms"} if isinstance(v, dict)
                else v) for k, v in latency.items()}


def _keep_other_parts(result: dict[str, Any], name: str) -> None:
    """A part not run this time keeps its previous results (and says from which revision),
    so ``--parts sizes`` does not erase the snapshot runs from the file and the docs."""
    previous = load_results(name)
    if not previous:
        return
    for part in ("sizes", "snapshot"):
        if part not in result and part in previous:
            result[part] = previous[part]
            origin = f"{previous.get('revision')}, {previous.get('finished_at')}"
            result.setdefault("kept", {})[part] = previous.get("kept", {}).get(part, origin)


def plots(result: dict[str, Any], name: str = "scale") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    sizes = result.get("sizes")
    if sizes:
        xs = [r["far_rows"] for r in sizes["delayq"]]
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
        a.plot(xs, [r["drain_s"] for r in sizes["delayq"]], "o-", label="delayq (median)")
        a.plot(xs, [r["ref_drain_s"] for r in sizes["delayq"]], "x:",
               label=f"delayq, {xs[0]:,} rows, same minutes")
        a.axhline(sizes["redis"]["drain"].get("seconds", 0), ls="--", c="k", label="redis")
        a.set_xscale("log")
        a.set_xlabel("far-future rows in the queue")
        a.set_ylabel(f"drain {sizes['delayq'][0]['drains']['big'][0].get('tasks')} no-ops (s)")
        b.plot(xs, [r["latency"]["immediate"].get("p99_ms") for r in sizes["delayq"]], "o-",
               label="delayq p99")
        b.axhline(sizes["redis"]["latency"]["immediate"].get("p99_ms", 0), ls="--", c="k",
                  label="redis p99")
        b.set_xscale("log")
        b.set_xlabel("far-future rows in the queue")
        b.set_ylabel("pick-up p99 (ms)")
        for ax in (a, b):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(IMG_DIR / f"bench_{name}_sizes.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def ab_section(data: dict[str, Any]) -> str:
    """The "Celery at scale, A/B" section: this checkout's drain against a revision's."""
    ab = data["ab"]
    load = (data["machine"]["load_average_at_start"][0], data["load_average_at_end"][0])
    lines = ["## Celery at scale: A/B against an earlier revision\n",
             run_line(data["command"], data.get("revision"), data.get("finished_at"),
                      data["machine"], load) + "\n"]
    rows = []
    for name, runs in ab["drains"].items():
        seconds = [d.get("seconds") for d in runs]
        cpu = statistics.median(d.get("worker_main_cpu_ms_per_task") or 0 for d in runs)
        label = f"delayq at {ab['rev']}" if "@" in name else "delayq (this revision)"
        rows.append([label, f"{ab['median_s'][name]} ({', '.join(map(str, seconds))})",
                     fmt_rate(statistics.median(d.get("tasks_per_s") or 0 for d in runs)),
                     round(cpu, 3)])
    lines.append(markdown_table(["", "drain s", "tasks/s", "worker main CPU ms/task"], rows,
                                "lrrr"))
    tasks = next(iter(ab["drains"].values()))[0].get("tasks")
    lines.append("\n" + prose(f"""
Drain of {tasks:,} no-ops by one worker (`-P prefork -c 2`, prefetch 4) with {ab['far_rows']:,}
far-future rows in the consumed queue, each revision on its own database (its schema made by its
own migrations, then VACUUM ANALYZE), {ab['rounds']} drains per side in alternating order:
median with every drain in brackets. This revision over {ab['rev']}:
{times(ab['ratio']) if ab['ratio'] else '-'} the time (below 1× is faster)."""))
    return "\n".join(lines) + "\n"


def section(data: dict[str, Any]) -> str:
    """The "Celery at scale" section of docs/benchmarks.md from a results document (its A/B
    variant when the document holds an ``ab`` part)."""
    if "ab" in data:
        return ab_section(data)
    name = data.get("benchmark", "scale")
    load = (data["machine"]["load_average_at_start"][0], data["load_average_at_end"][0])
    lines = ["## Celery at scale\n",
             run_line(data.get("command", "python bench/bench_scale.py --parts sizes"),
                      data.get("revision"), data.get("finished_at"), data["machine"], load)
             + "\n"]
    sizes = data.get("sizes")
    if sizes:
        if "sizes" in data.get("kept", {}):
            lines.append(f"Sizes kept from an earlier run ({data['kept']['sizes']}).\n")
        rows = []
        for r in sizes["delayq"]:
            big = [d.get("seconds") for d in r["drains"]["big"]]
            ref = [d.get("seconds") for d in r["drains"]["ref"]]
            cpu = statistics.median(d.get("worker_main_cpu_ms_per_task") or 0
                                    for d in r["drains"]["big"])
            rows.append([f"{r['far_rows']:,}", f"{r['drain_s']} ({', '.join(map(str, big))})",
                         f"{r['ref_drain_s']} ({', '.join(map(str, ref))})",
                         times(r["ratio"]) if r["ratio"] else "-", round(cpu, 3),
                         r["latency"]["immediate"].get("p99_ms")])
        rd = sizes["redis"]
        rows.append(["redis (reference)", rd["drain"].get("seconds"), "-", "-",
                     rd["drain"].get("worker_main_cpu_ms_per_task"),
                     rd["latency"]["immediate"].get("p99_ms")])
        ref_rows = f"{sizes['delayq'][0]['far_rows']:,}"
        lines.append(markdown_table(["far-future rows", "drain s", f"reference ({ref_rows}) s",
                                     "ratio", "worker main CPU ms/task", "pick-up p99 ms"],
                                    rows, "lllrrr"))
        lines.append(f"\n![sizes](img/bench_{name}_sizes.png)\n")
        lines.append(prose(f"""
Drain of {sizes['delayq'][0]['drains']['big'][0].get('tasks'):,} no-ops by one worker
(`-P prefork -c 2`, prefetch 4, as bench_celery's) with the far-future rows in the consumed
queue itself: median of {sizes['rounds']} drains per size (each in brackets), each paired with
a drain of a reference database holding {ref_rows} rows in the same minutes (alternating
order); the ratio is median over median. Redis drains the same tasks once for reference.
The held-snapshot runs have their own section, "Celery with a held snapshot"."""))
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--parts", default="sizes,snapshot", show_default=True)
@click.option("--sizes", default="10000,1000000,5000000,10000000", show_default=True)
@click.option("--drain", "drain_n", type=int, default=5000, show_default=True)
@click.option("--rounds", type=int, default=3, show_default=True,
              help="Paired drains (measured and reference database) per size.")
@click.option("--rate", type=float, default=150.0, show_default=True)
@click.option("--minutes", type=float, default=10.0, show_default=True,
              help="Length of each steady run of the snapshot part.")
@click.option("--redis-db", type=int, default=13, show_default=True)
@click.option("--counter-db", type=int, default=14, show_default=True)
@click.option("--database-url", default=DEFAULT_ADMIN_URL, show_default=True)
@click.option("--docs/--no-docs", "write_docs", default=True, show_default=True)
@click.option("--name", default="scale", show_default=True,
              help="Results file and docs section name (the snapshot part: NAME_snapshot).")
@click.option("--redis-from", default="",
              help="snapshot part: take the Redis reference line from this results file "
                   "(an earlier run with the same settings) instead of running it again.")
@click.option("--ab", "ab_rev", default="",
              help="Part ab: drain at the largest --sizes by this checkout and by revision "
                   "AB_REV, --rounds each, interleaved (results: scale_ab).")
@click.option("--server-note", default="",
              help="snapshot part: how the server was set up, quoted in the docs.")
def main(parts: str, sizes: str, drain_n: int, rounds: int, rate: float, minutes: float,
         redis_db: int, counter_db: int, database_url: str, write_docs: bool, name: str,
         server_note: str, redis_from: str, ab_rev: str) -> None:
    """Drain and pick-up vs waiting rows, and over time with a held snapshot, vs Redis."""
    handle_stop_signals()  # workers, producers and databases cleaned up on SIGTERM
    cfg = Settings.build(True, producers=2, admin_url=database_url, redis_db=redis_db,
                         counter_db=counter_db)
    cfg = dataclasses.replace(cfg, throughput_n=drain_n)
    result: dict[str, Any] = {"command": command_line(), "revision": git_revision(),
                              "machine": machine_info(database_url)}
    if ab_rev:
        with progress_bar() as progress:
            result["ab"] = part_ab(cfg, max(int(s) for s in sizes.split(",")), ab_rev, rounds,
                                   progress)
        result["load_average_at_end"] = list(os.getloadavg())
        ab_name = f"{name}_ab"
        console.print(f"results: {write_results(ab_name, result)}")
        doc = section(load_results(ab_name))
        console.print(doc)
        if write_docs:
            replace_section(ab_name, doc)
        return
    with progress_bar() as progress:
        if "sizes" in parts:
            result["sizes"] = part_sizes(cfg, [int(s) for s in sizes.split(",")], rounds,
                                         progress)
        if "snapshot" in parts:
            redis_run = None
            if redis_from:
                earlier = json.loads(Path(redis_from).read_text())
                redis_run = earlier["snapshot"]["redis"]
                # A carried-over line names the run that measured it, not the one that carried it.
                result["redis_from"] = earlier.get("redis_from") or (
                    f"the run at revision {earlier['revision']} "
                    f"({earlier.get('finished_at', '?')})")
            result["snapshot"] = snapshot.part_snapshot(cfg, rate, minutes, progress, redis_run)
    _keep_other_parts(result, name)
    result["load_average_at_end"] = list(os.getloadavg())
    if "snapshot" in parts:  # its own results file and section: the parts run separately
        snap_name = f"{name}_snapshot"
        with psycopg.connect(database_url) as conn:
            row = conn.execute("SHOW autovacuum").fetchone()
        result["machine"]["autovacuum"] = str(row[0]) if row else "?"
        result["machine"]["server_note"] = f" ({server_note})" if server_note else ""
        result.update(rate=rate, minutes=minutes, drain_n=drain_n)
        summary = {k: snapshot.summarize(v) for k, v in result["snapshot"].items()}
        result.update(snapshot_summary=summary, snapshot_verdict=snapshot.verdict(summary))
        console.print(f"results: {write_results(snap_name, result)}")
        snap_doc = snapshot.section(load_results(snap_name))
        console.print(snap_doc)
        if write_docs:
            snapshot.plot(result, IMG_DIR / f"bench_{snap_name}.png")
            replace_section(snap_name, snap_doc)
        result = {k: v for k, v in result.items() if not k.startswith("snapshot")}
    if "sizes" in parts:
        console.print(f"results: {write_results(name, result)}")
        if write_docs:
            plots(result, name)
            replace_section(name, section(load_results(name)))


if __name__ == "__main__":
    main()


#: The drain with the most far-future rows takes at most this much longer than with 10,000.
TARGET_RATIO = 1.1


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """This run's row of the page's "Targets at a glance": the largest size measured."""
    sizes = data.get("sizes", {}).get("delayq") or []
    biggest = max((r for r in sizes if r.get("ratio")), key=lambda r: r["far_rows"], default=None)
    if biggest is None:
        return []
    ref = f"{sizes[0]['far_rows']:,}"
    return [TargetRow(
        "scale", f"drain with {biggest['far_rows']:,} far-future rows ≤ {TARGET_RATIO}× the "
        f"drain with {ref}",
        f"{times(biggest['ratio'])} ({biggest['drain_s']} s vs {biggest['ref_drain_s']} s, "
        f"medians of {len(biggest['drains']['big'])} paired drains)",
        verdict(at_most(biggest["ratio"], TARGET_RATIO)))]
