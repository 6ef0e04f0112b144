"""Celery broker benchmark: delayq next to Redis, RabbitMQ and kombu's SQLAlchemy.

Every broker runs the same app (``celery_bench_app.py``) under the same real ``celery worker``
subprocess settings; only ``broker_url`` differs (plus each broker's redelivery option in the
kill phase). Phases, each run for every broker in turn before the next phase starts:

- ``throughput``: N no-op tasks published by a pool of producer processes while the worker
  runs; time from the first publish to the last execution (the task that brings a Redis counter
  to N stamps the time: the same one Redis round trip per task for every broker), with the CPU
  per task of each process meanwhile (producers, worker main, pool children, broker server);
  ``throughput_threads`` (``--producer-threads N``): the same with each producer process
  publishing from N threads, its rounds alternating with the 1-thread phase's;
- ``latency``: immediate tasks at a steady rate (``time.time() - sent_at`` in the task) and
  countdown tasks with countdowns spread over 2-10 s (``time.time() - eta``);
- ``rss``: worker RSS (main process + pool children) idle, then after 100,000 one-hour
  countdowns are published, sampled until it stops moving (at least 15 s, bounded);
- ``kill``: an ``acks_late`` task starts on worker A, worker B is started and ready, A is
  SIGKILLed; seconds until the task starts again on B.

Each phase gets a fresh broker state: a new PostgreSQL database (delayq, SQLAlchemy), a flushed
Redis database, a new RabbitMQ queue name (deleted afterwards); the harness is ``_celery.py``.
Writes ``bench/results/celery.json``, ``docs/img/bench_celery_*.png`` and the "Celery broker"
section of ``docs/benchmarks.md`` (``_celery_report.py``).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
import uuid
from typing import Any

import click
import psutil
from _celery import (
    BROKERS,
    CONCURRENCY,
    KILL_OPTIONS,
    MB,
    POOL,
    PREFETCH,
    WORKER_FLAGS,
    BrokerRun,
    Producers,
    Settings,
    Worker,
    broker_state,
    cleanup_counters,
    count_of,
    counter_client,
    counter_key,
    kill_all,
    list_len,
    noop_jobs,
    publish,
    publish_paced,
    publish_threaded,
    running_worker,
    wait_count,
)
from _celery_cpu import CpuMeter, phase_sweep
from _celery_report import (
    SWEEP_HEADERS,
    TARGETS,
    goal_table,
    section,
    summary_table,
    sweep_rows,
    write_plots,
)
from _common import (
    DEFAULT_ADMIN_URL,
    checkpoint,
    command_line,
    console,
    cpu_seconds,
    git_revision,
    handle_stop_signals,
    load_results,
    machine_info,
    markdown_table,
    percentile,
    progress_bar,
    write_results,
)
from _targets import replace_section
from _variants import AB_HEADERS, ab_rows, is_variant

PHASES = ("throughput", "throughput_threads", "drain", "latency", "rss", "kill", "sweep")
#: Phases run ``cfg.rounds`` times, interleaved round by round (brokers and phases alike).
ROUNDS_PHASES = ("throughput", "throughput_threads")


def phase_throughput(run: BrokerRun, cfg: Settings, progress: Any,
                     threads: int = 1) -> dict[str, Any]:
    """End to end, with the CPU per task each process used meanwhile (``cpu``). ``threads``:
    each producer process publishes from that many threads (``throughput_threads``)."""
    n = cfg.throughput_n
    fresh = uuid.uuid4().hex[:8]  # counters of their own: this phase runs several rounds
    key = counter_key(cfg, run.name, "tp", fresh)
    warm_key = counter_key(cfg, run.name, "tp-warm", fresh)
    with running_worker(run.env, f"tp-{run.name}", cfg) as worker, \
            Producers(run.env, cfg.producers) as producers:
        warm_n = 200
        producers.submit(publish, [("bench.noop", warm_n, (warm_key, warm_n), {})])
        warm = progress.add_task(f"{run.name}: warm-up", total=warm_n, rate="", unit="tasks")
        wait_count(cfg, warm_key, warm_n, 120, progress, warm, count_of)
        jobs = noop_jobs(key, n)
        ran = progress.add_task(f"{run.name}: no-op executed"
                                + (f", {threads} threads" if threads > 1 else ""),
                                total=n, rate="", unit="tasks")
        meter = CpuMeter(run, cfg.admin_url, producers.pids(), worker.proc.pid)
        meter.start()
        done = (producers.submit(publish_threaded, [(threads, job) for job in jobs])
                if threads > 1 else producers.submit(publish, jobs))
        # How far the worker got while the producers still ran (read within ~50 ms of the
        # last publish): on 2 shared cores the end-to-end time is mostly set by the CPU share
        # the worker gets next to the producers, then by how fast it drains the rest alone.
        at_publish_end: list[int] = []

        def note(seen: int) -> None:
            if not at_publish_end and len(done) == len(jobs):
                at_publish_end.append(seen)

        executed = wait_count(cfg, key, n, max(180.0, n / 20), progress, ran, count_of, note)
        cpu = meter.per_task(n)
        done_at = counter_client(cfg).get(f"{key}:done")
        if producers.errors:
            raise producers.errors[0]
    if executed < n or done_at is None or not done:
        return {"error": f"only {executed}/{n} tasks ran before the deadline"}
    first, last = min(d[0] for d in done), max(d[1] for d in done)
    seconds = float(done_at) - first
    return {"tasks": n, "producer_threads": threads, "cpu_us_per_task": cpu,
            "executions_counted": executed, "seconds": round(seconds, 3),
            "tasks_per_s": round(n / seconds, 1),
            "publish_seconds": round(last - first, 3),
            "publish_per_s": round(n / (last - first), 1),
            "executed_while_publishing": at_publish_end[0] if at_publish_end else None,
            "worker_per_s_while_publishing":
                round(at_publish_end[0] / (last - first), 1) if at_publish_end else None,
            "tail_seconds": round(float(done_at) - last, 3)}


def _latency_plan(cfg: Settings, imm_key: str, cd_key: str) -> list[tuple[float, str, float]]:
    rng = random.Random(7)
    window = cfg.latency_window_s
    plan = [(i * window / cfg.immediate_n, imm_key, 0.0) for i in range(cfg.immediate_n)]
    plan += [((i + 0.5) * window / cfg.countdown_n, cd_key, rng.uniform(2.0, 10.0))
             for i in range(cfg.countdown_n)]
    return sorted(plan)


def _percentiles(values_s: list[float]) -> dict[str, Any]:
    ms = sorted(v * 1000 for v in values_s)
    if not ms:
        return {"n": 0}
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    assert p50 is not None and p99 is not None
    return {"n": len(ms), "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
            "max_ms": round(ms[-1], 2), "min_ms": round(ms[0], 2),
            "samples_ms": [round(v, 3) for v in ms]}


def phase_latency(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    imm_key, cd_key = counter_key(cfg, run.name, "imm"), counter_key(cfg, run.name, "cd")
    warm_key = counter_key(cfg, run.name, "lat-warm")
    total = cfg.immediate_n + cfg.countdown_n
    with running_worker(run.env, f"lat-{run.name}", cfg), Producers(run.env, 1) as producers:
        warm = progress.add_task(f"{run.name}: warm-up", total=20, rate="", unit="tasks")
        producers.submit(publish_paced, [[(i * 0.05, warm_key, 0.0) for i in range(20)]])
        wait_count(cfg, warm_key, 20, 120, progress, warm, list_len)
        producers.submit(publish_paced, [_latency_plan(cfg, imm_key, cd_key)])
        bar = progress.add_task(f"{run.name}: latency samples", total=total, rate="",
                                unit="tasks")
        wait_count(cfg, "", total, cfg.latency_window_s + 40, progress, bar,
                    lambda c, _k: list_len(c, imm_key) + list_len(c, cd_key))
        if producers.errors:
            raise producers.errors[0]
    client = counter_client(cfg)
    values = {k: [float(v) for v in client.lrange(k, 0, -1)] for k in (imm_key, cd_key)}
    return {"immediate": _percentiles(values[imm_key]),
            "countdown": _percentiles(values[cd_key]),
            "expected": {"immediate": cfg.immediate_n, "countdown": cfg.countdown_n}}


def _settle(worker: Worker, run: BrokerRun, cfg: Settings, progress: Any, task: Any
            ) -> tuple[list[int], list[int | None]]:
    """Sample RSS and the broker's backlog every second until both stop moving.

    At least the minimum, at most the maximum; "stopped" means the last 5 samples agree within
    1 MB and the backlog (messages the worker has not taken yet) did not change.
    """
    samples: list[int] = []
    backlog: list[int | None] = []
    start = time.monotonic()
    while True:
        samples.append(worker.rss())
        backlog.append(run.waiting())
        elapsed = time.monotonic() - start
        progress.update(task, completed=min(elapsed, cfg.rss_settle_max_s),
                        rate=f"{samples[-1] / MB:8.1f} MB, {backlog[-1]} in broker")
        tail, waiting = samples[-5:], set(backlog[-5:])
        stable = len(tail) == 5 and max(tail) - min(tail) <= MB and len(waiting) == 1
        if elapsed >= cfg.rss_settle_max_s or (elapsed >= cfg.rss_settle_min_s and stable):
            return samples, backlog
        time.sleep(1.0)


def phase_rss(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    n = cfg.rss_n
    with running_worker(run.env, f"rss-{run.name}", cfg) as worker, \
            Producers(run.env, cfg.producers) as producers:
        idle_samples = []
        for _ in range(5):
            time.sleep(1.0)
            idle_samples.append(worker.rss())
        idle = statistics.median(idle_samples)
        jobs = [("bench.hour", min(1000, n - i), (), {"countdown": 3600})
                for i in range(0, n, 1000)]
        bar = progress.add_task(f"{run.name}: publish 1 h countdowns", total=n, rate="",
                                unit="tasks")
        done = producers.submit(publish, jobs)
        peak = idle
        deadline = time.monotonic() + max(600.0, n / 50)
        while len(done) < len(jobs) and time.monotonic() < deadline and not producers.errors:
            peak = max(peak, worker.rss())
            progress.update(bar, completed=sum(d[2] for d in done),
                            rate=f"RSS {peak / MB:7.1f} MB")
            time.sleep(0.25)
        if producers.errors:
            raise producers.errors[0]
        published = sum(d[2] for d in done)
        progress.update(bar, completed=published)
        settle = progress.add_task(f"{run.name}: RSS settling", total=cfg.rss_settle_max_s,
                                   rate="", unit="s")
        samples, backlog = _settle(worker, run, cfg, progress, settle)
        alive = worker.proc.poll() is None
    after, waiting = samples[-1], backlog[-1]
    held = None if waiting is None else published - waiting
    growth = (after - idle) / MB
    return {"published": published, "idle_mb": round(idle / MB, 1),
            "after_mb": round(after / MB, 1), "growth_mb": round(growth, 1),
            "peak_mb": round(max(peak, *samples) / MB, 1),
            "still_growing": samples[-1] - samples[max(0, len(samples) - 5)] > MB,
            "settle_seconds": len(samples), "waiting_in_broker": waiting,
            "held_by_worker": held,
            "kb_per_held_task": round(growth * 1024 / held, 2) if held else None,
            "worker_alive": alive}


def phase_kill(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    key = counter_key(cfg, run.name, "kill")
    client = counter_client(cfg)
    bar = progress.add_task(f"{run.name}: kill A, wait for B", total=2, rate="", unit="starts")
    a = Worker(run.env, f"kill-a-{run.name}", cfg.logdir)
    try:
        a.wait_ready()
        with Producers(run.env, 1) as producers:
            producers.submit(publish, [("bench.sleepy", 1, (key, 600.0), {})])
            if wait_count(cfg, key, 1, 60, progress, bar, list_len) < 1:
                return {"error": "the long task never started on worker A"}
        with running_worker(run.env, f"kill-b-{run.name}", cfg):
            killed_at = time.time()
            a.kill()
            seen = wait_count(cfg, key, 2, cfg.kill_bound_s, progress, bar, list_len)
            starts = [json.loads(s) for s in client.lrange(key, 0, -1)]
    finally:
        a.kill()
    if seen < 2:
        return {"rerun": False, "bound_s": cfg.kill_bound_s,
                "options": json.loads(run.env["BENCH_TRANSPORT_OPTIONS"])}
    second = starts[1]
    return {"rerun": True, "seconds": round(second["at"] - killed_at, 3),
            "redelivered_flag": second["redelivered"], "on": second["hostname"],
            "options": json.loads(run.env["BENCH_TRANSPORT_OPTIONS"])}


def phase_drain(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    """The consumer side alone: the no-ops are queued first, then one worker drains them with
    no producer competing for the CPU. Reports the rate and the worker main process' CPU per
    task, the figure the end-to-end run blurs with everything else on the machine."""
    n = cfg.throughput_n
    key = counter_key(cfg, run.name, "drain", uuid.uuid4().hex[:8])
    jobs = noop_jobs(key, n)
    queued = progress.add_task(f"{run.name}: queued", total=len(jobs), rate="", unit="chunks")
    with Producers(run.env, cfg.producers) as producers:
        done = producers.submit(publish, jobs)
        deadline = time.monotonic() + max(180.0, n / 20)
        while len(done) < len(jobs) and not producers.errors and time.monotonic() < deadline:
            progress.update(queued, completed=len(done))
            time.sleep(0.05)
        if producers.errors or len(done) < len(jobs):
            raise producers.errors[0] if producers.errors else TimeoutError("publishing")
    with running_worker(run.env, f"drain-{run.name}", cfg) as worker:
        main = psutil.Process(worker.proc.pid)
        started, cpu_start = time.time(), cpu_seconds(main)
        ran = progress.add_task(f"{run.name}: drained", total=n, rate="", unit="tasks")
        executed = wait_count(cfg, key, n, max(180.0, n / 20), progress, ran, count_of)
        cpu_s = cpu_seconds(main) - cpu_start
        done_at = counter_client(cfg).get(f"{key}:done")
    if executed < n or done_at is None:
        return {"error": f"only {executed}/{n} tasks ran before the deadline"}
    seconds = float(done_at) - started
    return {"tasks": n, "seconds": round(seconds, 3), "tasks_per_s": round(n / seconds, 1),
            "worker_main_cpu_ms_per_task": round(cpu_s * 1000 / n, 3)}


def phase_throughput_threads(run: BrokerRun, cfg: Settings, progress: Any) -> dict[str, Any]:
    """The throughput phase with producers that publish from ``--producer-threads`` threads."""
    return phase_throughput(run, cfg, progress, threads=cfg.producer_threads)


PHASE_FUNCS = {"throughput": phase_throughput, "throughput_threads": phase_throughput_threads,
               "latency": phase_latency, "rss": phase_rss, "kill": phase_kill,
               "drain": phase_drain, "sweep": phase_sweep}


def run_all(cfg: Settings, brokers: list[str], phases: list[str]) -> dict[str, Any]:
    """Every phase for every broker; throughput ``cfg.rounds`` times, brokers interleaved, so
    a slow minute of a shared machine does not land on one broker only (median reported).
    Every phase starts after a CHECKPOINT, so none pays for the previous one's writes."""
    results: dict[str, dict[str, Any]] = {b: {} for b in brokers}
    plan = _plan(phases, cfg.rounds)
    with progress_bar() as progress:
        overall = progress.add_task("phases", total=len(brokers) * len(plan), rate="",
                                    unit="runs")
        for phase, rnd in plan:
            # Rounds rotate the order, so no broker always runs right after the same peer.
            for broker in brokers[rnd % len(brokers):] + brokers[:rnd % len(brokers)]:
                checkpoint(cfg.admin_url)
                try:
                    with broker_state(broker, phase, cfg, acks_late=phase == "kill") as run:
                        outcome = PHASE_FUNCS[phase](run, cfg, progress)
                except Exception as exc:  # noqa: BLE001 - one broker failing must not end the run
                    console.print(f"[red]{broker}/{phase} failed: {exc!r}")
                    outcome = {"error": repr(exc)}
                results[broker].setdefault(f"{phase}_rounds", []).append(outcome)
                progress.advance(overall)
    for broker_results in results.values():
        for phase in phases:
            broker_results[phase] = _median_round(broker_results.pop(f"{phase}_rounds"))
    return results


def _plan(phases: list[str], rounds: int) -> list[tuple[str, int]]:
    """(phase, round) in run order: the repeated phases round by round where the first of them
    stands (1 thread and N threads alternate, as the brokers do), the others once."""
    repeated = [p for p in phases if p in ROUNDS_PHASES]
    plan: list[tuple[str, int]] = []
    for phase in phases:
        if phase not in ROUNDS_PHASES:
            plan.append((phase, 0))
        elif phase == repeated[0]:
            plan += [(p, rnd) for rnd in range(rounds) for p in repeated]
    return plan


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median throughput (the only phase with several), all rates kept."""
    if len(rounds) == 1:
        return rounds[0]
    ok = sorted((r for r in rounds if "tasks_per_s" in r), key=lambda r: r["tasks_per_s"])
    if not ok:
        return rounds[0]
    return {**ok[(len(ok) - 1) // 2], "rounds_tasks_per_s": [r.get("tasks_per_s") for r in rounds],
            "rounds_cpu_us_per_task": [r.get("cpu_us_per_task") for r in rounds]}


@click.command()
@click.option("--quick", is_flag=True, help="Small sizes for a smoke run.")
@click.option("--only", default=",".join(p for p in PHASES
                                         if p not in ("sweep", "throughput_threads")),
              show_default=True,
              help="Comma-separated phases: throughput,drain,latency,rss,kill, and sweep "
                   "(1/2/4 producers x 1/2/4 workers; not run by default); throughput_threads "
                   "comes with throughput when --producer-threads is above 1.")
@click.option("--brokers", "brokers_opt", show_default=True,
              default=",".join(b for b in BROKERS
                               if b not in ("delayq_unlogged", "delayq_buffered")
                               and not b.startswith("delayq_pgbouncer")),
              help="Comma-separated brokers: delayq,redis,amqp,sqlalchemy (and "
                   "delayq_durable: delayq with durable_publish=True, beside amqp_confirm: "
                   "RabbitMQ with publisher confirms; delayq_unlogged: with "
                   "unlogged_table=True; delayq_buffered: with publish_linger=0.005; "
                   "delayq_pgbouncer: through PgBouncer in transaction pooling, started for "
                   "each phase; delayq_pgbouncer_listen: the same with a direct listen_url). "
                   "A/B: delayq@REV runs another revision's delayq, delayq~option=value adds "
                   "a transport option (bench/_variants.py); the first named is the reference, "
                   "the table goes to bench/results/celery_ab.json, never to the docs.")
@click.option("--admin-url", default=DEFAULT_ADMIN_URL, show_default=True,
              help="PostgreSQL URL allowed to create the per-phase databases.")
@click.option("--redis-db", default=11, show_default=True, help="Redis db used as the broker.")
@click.option("--counter-db", default=12, show_default=True, help="Redis db for the counters.")
@click.option("--producers", default=2, show_default=True, help="Producer processes.")
@click.option("--producer-threads", default=1, show_default=True,
              help="Above 1: the throughput_threads phase runs beside throughput (rounds "
                   "interleaved), each producer process publishing from this many threads.")
@click.option("--producer-nice", default=0, show_default=True,
              help="Niceness of the producer processes (every broker alike): a diagnostic of "
                   "how much the end-to-end figure depends on the CPU share producers take "
                   "from the worker on a small machine. The recorded runs use 0.")
@click.option("--rounds", default=0, help="Throughput rounds per broker (default: 3, --quick 1).")
@click.option("--no-write", is_flag=True,
              help="Only print the table: no results file, plots or docs (smoke runs).")
def main(quick: bool, only: str, brokers_opt: str, admin_url: str, redis_db: int,
         counter_db: int, producers: int, producer_threads: int, producer_nice: int,
         rounds: int, no_write: bool) -> None:
    """Benchmark Celery on delayq, Redis, RabbitMQ and kombu's SQLAlchemy transport."""
    if producer_nice:
        if not no_write:
            raise click.BadParameter("a diagnostic: use it with --no-write",
                                     param_hint="--producer-nice")
        os.environ["BENCH_PRODUCER_NICE"] = str(producer_nice)
    phases = _choices(only, PHASES, "--only")
    if producer_threads > 1 and "throughput" in phases and "throughput_threads" not in phases:
        phases.insert(phases.index("throughput") + 1, "throughput_threads")
    if "throughput_threads" in phases and producer_threads < 2:
        raise click.BadParameter("throughput_threads needs --producer-threads 2 or more",
                                 param_hint="--only")
    brokers = _choices(brokers_opt, BROKERS, "--brokers")
    if redis_db == counter_db:
        raise click.BadParameter("must differ from --counter-db", param_hint="--redis-db")
    handle_stop_signals()  # workers, producers and databases cleaned up on SIGTERM
    cfg = Settings.build(quick, producers=producers, admin_url=admin_url, redis_db=redis_db,
                         counter_db=counter_db, producer_threads=producer_threads,
                         throughput_rounds=rounds)
    info = machine_info(admin_url)
    console.print(f"run {cfg.run_id}: worker logs in {cfg.logdir}")
    try:
        results = run_all(cfg, brokers, phases)
    finally:
        kill_all()
        cleanup_counters(cfg)
    info["load_average_at_end"] = list(os.getloadavg())
    console.print(summary_table(results, brokers, vars(cfg)))
    console.print(goal_table(results, vars(cfg)))
    if "sweep" in phases:
        console.print(markdown_table(SWEEP_HEADERS, sweep_rows(results, brokers)))
    ab = any(is_variant(b) for b in brokers)
    if ab:  # delayq@REV / delayq~option=value: the A/B table, never the docs' section
        console.print(markdown_table(AB_HEADERS, [
            row for phase in ("throughput", "throughput_threads") if phase in phases
            for row in ab_rows(results, brokers, phase)], "ll" + "r" * 9))
    if no_write:
        return
    if not ab:  # the docs' plots are the recorded run's, never an A/B's
        write_plots(results, brokers)
    settings = {"pool": POOL, "concurrency": CONCURRENCY, "prefetch_multiplier": PREFETCH,
                "worker_flags": list(WORKER_FLAGS), "kill_options": KILL_OPTIONS,
                "quick": quick, **{k: v for k, v in vars(cfg).items()
                                   if isinstance(v, int | float | str) and k != "admin_url"}}
    data = {"command": command_line(), "revision": git_revision(), "machine": info,
            "settings": settings, "targets": TARGETS, "results": results}
    if ab:
        console.print(f"results: {write_results('celery_ab', data)}")
        return
    path = write_results("celery", data)
    doc = replace_section("celery", section(load_results("celery")))
    console.print(f"results: {path}\ndocs: {doc}")


def _choices(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    """The chosen names in the canonical order; variants (bench/_variants.py) follow in the
    order given."""
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in allowed and not is_variant(v)]
    if unknown or not chosen:
        raise click.BadParameter(f"unknown {unknown or value!r}; choose from {allowed}, or "
                                 "delayq@REV / delayq~option=value", param_hint=flag)
    if any(is_variant(v) for v in chosen):
        return list(dict.fromkeys(chosen))  # an A/B run: the first is the reference
    return [v for v in allowed if v in chosen]


if __name__ == "__main__":
    main()
