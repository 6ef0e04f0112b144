"""bench_celery.py's report: its docs section, console tables and plots, from its results.

Everything here reads the results document (``bench/results/celery.json``) and nothing else,
so ``render_docs.py`` can rewrite the section from a stored run without running it. One row per
metric and one column per broker keeps every broker's figure for a metric side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    IMG_DIR,
    TargetRow,
    at_least,
    at_most,
    grouped_bar_chart,
    markdown_table,
    prose,
    run_line,
    save_figure,
    times,
    verdict,
)

TARGETS = {"latency_p99_ms": 25.0, "rss_growth_mb": 20.0, "kill_s": 10.0,
           # Issue 9: end to end at least Redis' rate; a worker alone on a backlog at least
           # RabbitMQ's.
           "throughput_vs_redis": 1.0, "drain_vs_amqp": 1.0,
           # Issue 37, end to end with the default options: delayq against RabbitMQ with
           # 1-thread and with N-thread producers; equal guarantee (the row committed when
           # apply_async returns) against publisher confirms, default and durable_publish.
           "throughput_vs_amqp": 1.0, "threads_vs_amqp": 1.0, "default_vs_confirm": 1.3,
           "durable_vs_confirm": 1.2,
           # Issue 37, CPU per task against RabbitMQ's in the same phase: PostgreSQL (backends
           # plus WAL writer etc.) at most RabbitMQ server's, producers at most 1.1x its.
           "server_vs_amqp_cpu": 1.0, "producers_vs_amqp_cpu": 1.1}
#: A 1-minute load average at start below this (2 cores) counts as a quiet machine.
QUIET_LOAD = 1.5
LABELS = {"delayq": "delayq", "delayq_durable": "delayq, durable_publish",
          "delayq_unlogged": "delayq, unlogged_table", "delayq_buffered": "delayq, publish_linger",
          "delayq_pgbouncer": "delayq via PgBouncer (transaction)",
          "delayq_pgbouncer_listen": "delayq via PgBouncer + listen_url",
          "redis": "Redis", "amqp": "RabbitMQ", "amqp_confirm": "RabbitMQ, confirm_publish",
          "sqlalchemy": "kombu SQLAlchemy"}


def _get(results: dict[str, Any], broker: str, phase: str, *path: str) -> Any:
    value: Any = results.get(broker, {}).get(phase, {})
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


@dataclass(frozen=True)
class Metric:
    """One row: how to read and show a broker's figure, and delayq's target if it has one."""

    label: str
    path: tuple[str, ...]
    show: Callable[[dict[str, Any], str, Any], str]
    ratio: bool = False
    target: str = ""
    #: delayq's value against its target: None when it cannot be judged (no peer ran).
    check: Callable[[dict[str, Any], Any], bool | None] | None = None


def _num(fmt: str) -> Callable[[dict[str, Any], str, Any], str]:
    return lambda results, broker, value: format(value, fmt)


def _vs(phase: str, target: str, ours: str = "delayq", base: str = "amqp"
        ) -> Callable[[dict[str, Any], Any], bool | None]:
    """The check "``ours`` ≥ TARGETS[target] × ``base``" on a phase's end-to-end rate."""
    def check(results: dict[str, Any], value: Any) -> bool | None:
        mine, theirs = (_get(results, b, phase, "tasks_per_s") for b in (ours, base))
        return None if not mine or not theirs else at_least(mine / theirs, TARGETS[target])
    return check


def _end_to_end(phase: str) -> Callable[[dict[str, Any], str, Any], str]:
    def show(results: dict[str, Any], broker: str, value: Any) -> str:
        rounds = [r for r in _get(results, broker, phase, "rounds_tasks_per_s") or [] if r]
        spread = f" ({min(rounds):,.0f}–{max(rounds):,.0f})" if len(rounds) > 1 else ""
        return f"{value:,.0f}{spread}"
    return show


def _cpu(results: dict[str, Any], broker: str, value: Any) -> str:
    """producers / worker main / pool children / server (+ PostgreSQL's background)."""
    parts = [value.get(k) for k in ("producers_us", "worker_main_us", "worker_pool_us",
                                    "server_us")]
    if any(p is None for p in parts):
        return "—"
    aux = value.get("pg_aux_us")
    return " / ".join(f"{p:,}" for p in parts) + ("" if aux is None else f" (+{aux:,})")


def _pair(phase: str, kind: str) -> Callable[[dict[str, Any], str, Any], str]:
    def show(results: dict[str, Any], broker: str, value: Any) -> str:
        p50 = _get(results, broker, phase, kind, "p50_ms")
        return f"{'—' if p50 is None else format(p50, '.1f')} / {value:.1f}"
    return show


def _rss(results: dict[str, Any], broker: str, value: Any) -> str:
    return f"{_get(results, broker, 'rss', 'idle_mb'):,.0f} → {value:,.0f}"


def _held(results: dict[str, Any], broker: str, value: Any) -> str:
    growing = ", still growing" if _get(results, broker, "rss", "still_growing") else ""
    return f"{value:,}{growing}"


def _kill(results: dict[str, Any], broker: str, value: Any) -> str:
    return f"{value:.2f}"


def metrics(settings: dict[str, Any]) -> list[Metric]:
    """The rows, labelled with the sizes of the run."""
    n, rss_n = settings.get("throughput_n", 0), settings.get("rss_n", 0)
    threads = settings.get("producer_threads", 1)
    cpu = "CPU µs/task: producers / worker main / pool / broker server (+ PG WAL writer etc.)"
    return [
        Metric(f"no-op end to end, {n:,} tasks, tasks/s (rounds)", ("throughput", "tasks_per_s"),
               _end_to_end("throughput"), True,
               f"≥ {TARGETS['throughput_vs_amqp']:.1f}× RabbitMQ",
               _vs("throughput", "throughput_vs_amqp")),
        Metric("publish rate meanwhile, tasks/s", ("throughput", "publish_per_s"), _num(",.0f"),
               True),
        Metric("executed while publishing, tasks/s",
               ("throughput", "worker_per_s_while_publishing"), _num(",.0f"), True),
        Metric("then drained alone for, s", ("throughput", "tail_seconds"), _num(".2f")),
        Metric(f"{cpu}, end to end", ("throughput", "cpu_us_per_task"), _cpu),
        Metric(f"no-op end to end, producers from {threads} threads each, tasks/s (rounds)",
               ("throughput_threads", "tasks_per_s"), _end_to_end("throughput_threads"), True,
               f"≥ {TARGETS['threads_vs_amqp']:.1f}× RabbitMQ",
               _vs("throughput_threads", "threads_vs_amqp")),
        Metric(f"{cpu}, {threads} threads", ("throughput_threads", "cpu_us_per_task"), _cpu),
        Metric(f"worker alone on {n:,} queued, tasks/s", ("drain", "tasks_per_s"), _num(",.0f"),
               True),
        Metric("worker main-process CPU per task, ms", ("drain", "worker_main_cpu_ms_per_task"),
               _num(".2f"), True),
        Metric("pick-up latency p50 / p99, ms", ("latency", "immediate", "p99_ms"),
               _pair("latency", "immediate"), False, "p99 ≤ 25 ms",
               lambda r, v: v <= TARGETS["latency_p99_ms"]),
        Metric("countdown lateness p50 / p99, ms", ("latency", "countdown", "p99_ms"),
               _pair("latency", "countdown"), False, "p99 ≤ 25 ms",
               lambda r, v: v <= TARGETS["latency_p99_ms"]),
        Metric(f"worker RSS idle → after {rss_n:,} one-hour countdowns, MB",
               ("rss", "after_mb"), _rss, False, "≤ +20 MB",
               lambda r, v: (_get(r, "delayq", "rss", "growth_mb") or 0)
               <= TARGETS["rss_growth_mb"]),
        Metric("one-hour countdowns held in the worker", ("rss", "held_by_worker"), _held),
        Metric("killed `acks_late` task runs again after, s", ("kill", "seconds"), _kill, False,
               "≤ 10 s", lambda r, v: v <= TARGETS["kill_s"]),
    ]


def _ratio(results: dict[str, Any], base: str, path: tuple[str, ...]) -> str:
    ours, theirs = _get(results, "delayq", *path), _get(results, base, *path)
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float) or not theirs:
        return "—"
    return times(ours / theirs)


def summary_rows(results: dict[str, Any], brokers: list[str],
                 settings: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: a metric per row, a broker per column, delayq's ratios and target."""
    headers = ["metric", *(LABELS.get(b, b) for b in brokers), "delayq vs Redis",
               "vs RabbitMQ", "target (delayq)", "met?"]
    rows = []
    for m in metrics(settings):
        cells, any_value = [], False
        for broker in brokers:
            value = _get(results, broker, *m.path)
            if value is None:
                bound = _get(results, broker, "kill", "bound_s")
                cells.append(f"not within {bound:g} s" if m.path[0] == "kill" and bound else "—")
                continue
            any_value = True
            cells.append(m.show(results, broker, value))
        if not any_value:
            continue
        ours = _get(results, "delayq", *m.path)
        ok = None if m.check is None or ours is None else m.check(results, ours)
        met = "" if ok is None else ("yes" if ok else "**no**")
        ratios = ([_ratio(results, "redis", m.path), _ratio(results, "amqp", m.path)]
                  if m.ratio else ["", ""])
        rows.append([m.label, *cells, *ratios, m.target, met])
    return headers, rows


def summary_table(results: dict[str, Any], brokers: list[str],
                  settings: dict[str, Any]) -> str:
    headers, rows = summary_rows(results, brokers, settings)
    return markdown_table(headers, rows, "l" + "r" * (len(headers) - 3) + "ll")


#: Issue 37's ratios: (ours, base, phase, target key), shown when both brokers ran the phase.
GOALS = (("delayq", "redis", "throughput", "throughput_vs_redis"),
         ("delayq", "amqp", "throughput", "throughput_vs_amqp"),
         ("delayq", "amqp", "throughput_threads", "threads_vs_amqp"),
         ("delayq", "amqp_confirm", "throughput", "default_vs_confirm"),
         ("delayq", "amqp_confirm", "throughput_threads", "default_vs_confirm"),
         ("delayq_durable", "amqp_confirm", "throughput", "durable_vs_confirm"),
         ("delayq_durable", "amqp_confirm", "throughput_threads", "durable_vs_confirm"),
         ("delayq", "amqp", "drain", "drain_vs_amqp"))
#: Issue 37's CPU ratios, delayq against RabbitMQ: (what, our parts, RabbitMQ's, target key).
CPU_GOALS = (("PostgreSQL (backends + background) / RabbitMQ server", ("server_us", "pg_aux_us"),
              ("server_us",), "server_vs_amqp_cpu"),
             ("producers / RabbitMQ producers", ("producers_us",), ("producers_us",),
              "producers_vs_amqp_cpu"))


def _producers(phase: str, settings: dict[str, Any]) -> str:
    if phase == "drain":
        return "worker alone on a backlog"
    return (f"producers {settings.get('producer_threads', 1)} threads each"
            if phase == "throughput_threads" else "producers 1 thread each")


def _cpu_sum(results: dict[str, Any], broker: str, phase: str, parts: tuple[str, ...]
             ) -> float | None:
    cpu = _get(results, broker, phase, "cpu_us_per_task") or {}
    values = [cpu.get(p) for p in parts]
    return float(sum(v or 0 for v in values)) if cpu and values[0] else None


def goal_rows(results: dict[str, Any], settings: dict[str, Any]) -> list[list[str]]:
    """Ratios against their targets (medians of the interleaved rounds): what, the figures
    compared, the ratio, the target, met."""
    rows = []
    for ours, base, phase, target in GOALS:
        mine, theirs = (_get(results, b, phase, "tasks_per_s") for b in (ours, base))
        if not mine or not theirs:
            continue
        ratio, want = mine / theirs, TARGETS[target]
        rows.append([f"{LABELS[ours]} / {LABELS[base]}, {_producers(phase, settings)}",
                     f"{mine:,.0f} vs {theirs:,.0f} tasks/s", times(ratio), f"≥ {want:.1f}×",
                     verdict(at_least(ratio, want))])
    for phase in ("throughput", "throughput_threads"):
        producers = _producers(phase, settings)
        for what, ours_parts, base_parts, target in CPU_GOALS:
            mine = _cpu_sum(results, "delayq", phase, ours_parts)
            theirs = _cpu_sum(results, "amqp", phase, base_parts)
            if not mine or not theirs:
                continue
            ratio, want = mine / theirs, TARGETS[target]
            rows.append([f"CPU µs/task, {what}, {producers}", f"{mine:,.0f} vs {theirs:,.0f}",
                         times(ratio), f"≤ {want:.1f}×", verdict(at_most(ratio, want))])
    return rows


def goal_table(results: dict[str, Any], settings: dict[str, Any]) -> str:
    rows = [[f"{what} ({figures})", ratio, target, met]
            for what, figures, ratio, target, met in goal_rows(results, settings)]
    return markdown_table(["end to end", "ratio", "target", "met?"], rows, "lrll") if rows else ""


def goal_prose(results: dict[str, Any], settings: dict[str, Any]) -> str:
    """The same as one paragraph, for the page (which has a line budget)."""
    rows = goal_rows(results, settings)
    return prose("Targets, medians: " + "; ".join(
        f"{what} ({figures}) {ratio} ({target}, {'met' if met == 'yes' else '**not met**'})"
        for what, figures, ratio, target, met in rows) + ".") if rows else ""


SWEEP_HEADERS = ["broker", "producers", "workers", "tasks/s", "machine busy %",
                 "broker server cores", "server µs/task", "workers µs/task", "producers µs/task"]


def sweep_rows(results: dict[str, Any], brokers: list[str]) -> list[list[str]]:
    rows = []
    for broker in brokers:
        for p in (results.get(broker, {}).get("sweep") or {}).get("points", []):
            if "error" in p:
                rows.append([broker, str(p["producers"]), str(p["workers"]), p["error"]]
                            + [""] * 5)
                continue
            rows.append([broker, str(p["producers"]), str(p["workers"]),
                         f"{p['tasks_per_s']:,.0f}",
                         f"{p['machine_busy_pct']:.0f}", f"{p['server_cores']:.2f}",
                         str(p["server_cpu_us_per_task"]), str(p["workers_cpu_us_per_task"]),
                         str(p["producers_cpu_us_per_task"])])
    return rows


PLOTS = {"throughput": IMG_DIR / "bench_celery_throughput.png",
         "rss": IMG_DIR / "bench_celery_rss.png",
         "latency": IMG_DIR / "bench_celery_latency.png"}


def _plotted(results: dict[str, Any], brokers: list[str]) -> dict[str, list[str]]:
    """The brokers each plot shows: those that ran its phase."""
    return {"throughput": [b for b in brokers if _get(results, b, "throughput", "tasks_per_s")],
            "rss": [b for b in brokers if _get(results, b, "rss", "after_mb")],
            "latency": [b for b in brokers
                        if _get(results, b, "latency", "immediate", "samples_ms")]}


def write_plots(results: dict[str, Any], brokers: list[str]) -> None:
    shown = _plotted(results, brokers)
    if shown["throughput"]:
        grouped_bar_chart(
            PLOTS["throughput"], shown["throughput"],
            {"end-to-end (publish → last run)": [
                _get(results, b, "throughput", "tasks_per_s") for b in shown["throughput"]],
             "publish only": [_get(results, b, "throughput", "publish_per_s")
                              for b in shown["throughput"]]},
            title="No-op task throughput", ylabel="tasks/s")
    if shown["rss"]:
        grouped_bar_chart(
            PLOTS["rss"], shown["rss"],
            {"idle": [_get(results, b, "rss", "idle_mb") for b in shown["rss"]],
             "after the 1 h countdowns": [_get(results, b, "rss", "after_mb")
                                          for b in shown["rss"]]},
            title="Worker RSS (main + pool children)", ylabel="MB")
    if shown["latency"]:
        _latency_cdf(results, shown["latency"])


def _latency_cdf(results: dict[str, Any], brokers: list[str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    titles = {"immediate": "Pick-up latency (send → run)", "countdown": "Countdown lateness"}
    for ax, kind in zip(axes, ("immediate", "countdown"), strict=True):
        for broker in brokers:
            ms = _get(results, broker, "latency", kind, "samples_ms") or []
            if ms:
                ax.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))], label=broker)
        ax.axvline(TARGETS["latency_p99_ms"], color="grey", linestyle=":", label="25 ms")
        ax.axhline(0.99, color="grey", linestyle="--", linewidth=0.6)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of tasks")
        ax.set_title(titles[kind])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, PLOTS["latency"])


def section(data: dict[str, Any]) -> str:
    """The "Celery broker" section of docs/benchmarks.md from a results document."""
    results, s, m = data["results"], data["settings"], data["machine"]
    brokers = list(results)
    load = (m["load_average_at_start"][0], m["load_average_at_end"][0])
    quiet = ("" if load[0] < QUIET_LOAD else
             "\n\n**Measured under load**: treat the absolute figures as indicative.")
    rounds = ("one round" if s.get("quick") else
              "3 rounds with the brokers interleaved, the median shown (range in brackets)")
    images = "\n\n".join(f"![{name}](img/{PLOTS[name].name})"
                         for name, shown in _plotted(results, brokers).items() if shown)
    errors = [f"- {b}/{p}: `{v['error']}`" for b in brokers for p, v in results[b].items()
              if isinstance(v, dict) and "error" in v]
    command = data.get("command") or (
        "python bench/bench_celery.py" + (" --quick" if s.get("quick") else ""))
    threads = (f" (then from {s['producer_threads']} threads each, sharing the process' "
               "producer pool, rounds alternating)" if s.get("producer_threads", 1) > 1 else "")
    how = prose(f"""
Every broker runs `bench/celery_bench_app.py` in real `celery worker` subprocesses (`-P
{s['pool']} -c {s['concurrency']}`, prefetch multiplier {s['prefetch_multiplier']}, default
transport options), each task reporting to a Redis counter. End to end: {s['producers']}
producer processes publish{threads} while the worker runs, first publish to last execution,
{rounds}; CPU per task of each process meanwhile (psutil; the broker server: this database's
PostgreSQL backends, `redis-server` or `beam.smp`). Worker alone: the same tasks queued first.
Latency: {s['immediate_n']} immediate tasks over {s['latency_window_s']:g} s and
{s['countdown_n']} countdowns of 2-10 s. Kill: delayq with `acquire_timeout=10`, Redis with
`visibility_timeout=10` and a restore sweep every 10 s. `durable_publish` waits for the WAL
flush, `confirm_publish` for RabbitMQ's confirm. Redis, RabbitMQ and SQLAlchemy hold countdowns
in the worker's memory until due; delayq keeps them in PostgreSQL.""")
    return f"""## Celery broker

{run_line(command, data.get("revision"), data.get("finished_at"), m, load)}{quiet}

{summary_table(results, brokers, s)}
{chr(10) + goal_prose(results, s) + chr(10) if goal_rows(results, s) else ""}
{images}

{how}
{chr(10).join(["", "Errors:", *errors]) if errors else ""}"""


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """This run's rows of the page's "Targets at a glance": the ratios of :func:`goal_rows`
    and the metrics with a target of delayq's own (latency, memory, redelivery)."""
    results, settings = data["results"], data["settings"]
    rows = [TargetRow("Celery", f"{what}: {target}", f"{ratio} ({figures})", met)
            for what, figures, ratio, target, met in goal_rows(results, settings)]
    for m in metrics(settings):
        ours = _get(results, "delayq", *m.path)
        if m.check is None or ours is None or "RabbitMQ" in m.target:
            continue  # the end-to-end ratios are goals above
        rows.append(TargetRow("Celery", f"{m.label}: {m.target}",
                              m.show(results, "delayq", ours), verdict(m.check(results, ours))))
    return rows
