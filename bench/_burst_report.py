"""The sections of docs/benchmarks.md that ``bench_burst.py`` writes (and
``render_docs.py`` rewrites from ``bench/results/{burst,peers,many_workers}.json``), and the
names of the systems it compares."""

from __future__ import annotations

from typing import Any

from _common import markdown_table, prose, run_line, spread

MODES = ("burst", "peers", "many")
DELAYQ_SYSTEMS = ("celery", "dramatiq")
PEERS = ("pgqueuer", "pgqueuer_limit4", "procrastinate", "pgqueuer_relaxed",
         "procrastinate_relaxed", "pgqueuer_asyncpg")
#: Named only: asyncpg is not among the bench extra's packages (psycopg is PgQueuer's other
#: documented driver, and the one installed).
OPT_IN = ("pgqueuer_asyncpg",)
SYSTEMS = DELAYQ_SYSTEMS + PEERS
LABELS = {
    "celery": "delayq, Celery transport",
    "dramatiq": "delayq, Dramatiq broker",
    "pgqueuer": "PgQueuer 1.6 (no concurrency limit)",
    "pgqueuer_limit4": "PgQueuer 1.6 (`concurrency_limit=4`)",
    "pgqueuer_relaxed": "PgQueuer 1.6, `synchronous_commit=off`",
    "procrastinate": "Procrastinate 3.10",
    "procrastinate_relaxed": "Procrastinate 3.10, `synchronous_commit=off`",
    "pgqueuer_asyncpg": "PgQueuer 1.6 on asyncpg (no concurrency limit)",
}
#: What each peer runs with, as the docs section says it.
PEER_NOTES = """PgQueuer: `pgqueuer.run()` on a `QueueManager` (what `pgq run` does) with its
defaults (`batch_size=10`, `dequeue_timeout=30 s`, no `max_concurrent_tasks`, tables LOGGED,
`durability=durable`); an entrypoint has no concurrency limit unless given one, so it runs
twice: as it comes, and with `concurrency_limit=4` (its per-entrypoint limit, enforced in the
database across workers; `max_concurrent_tasks` cannot be 4 at the default batch of 10: it must
be at least twice the batch). Its worker runs on psycopg (`PsycopgDriver`, one of its two
documented drivers; asyncpg, the other, is not among the bench extra's packages: `--systems
pgqueuer_asyncpg` runs it where it is installed). That driver reads notifications with
`notifies(timeout=1.0)` on the connection its queries use, and countdowns ran up to ~1 s late
in a cycle of about a second in a check of 10 spaced ones: PgQueuer's lateness here is that
driver's, not its deferred-job timer's. Producers: `SyncQueries.enqueue` and `Queries.enqueue`
(async), delays as `execute_after`. Procrastinate: `App(PsycopgConnector)`, `run_worker_async(
concurrency=4)`, its defaults otherwise (`listen_notify=True`, `fetch_job_polling_interval=5 s`:
scheduled jobs are found by that poll, not by a notification); producers `defer` (the app opened
synchronously) and `defer_async`, delays as `schedule_at`. Both at PostgreSQL's
`synchronous_commit=on`, where delayq's publishes, polls and acks commit without waiting for the
WAL flush (its relaxed pool; `durable_publish` opts out): the `_relaxed` rows give the peers the
same (`options=-c synchronous_commit=off` on every connection)."""
#: Issue 41's targets.
TARGET_P99_MS, TARGET_MAX_MS = 10.0, 50.0


def _med(got: dict[str, Any], name: str) -> float | None:
    fig = got.get(name)
    return None if fig is None else fig["median"]


def _ms(got: dict[str, Any], name: str) -> str:
    """A median in ms with the rounds' min-max (one decimal, as the other sections)."""
    fig = got.get(name)
    return "—" if fig is None else spread(fig["median"], fig["min"], fig["max"], "{:,.1f}")


def _count(got: dict[str, Any], name: str) -> str:
    fig = got.get(name)
    return "—" if fig is None else spread(fig["median"], fig["min"], fig["max"], "{:,.0f}")


def _label(label: str) -> str:
    system, _, variant = label.partition(" ")
    return LABELS.get(system, system) + (f" {variant}" if variant else "")


def _verdict(got: dict[str, Any]) -> str:
    p99, worst = _med(got, "p99_ms"), _med(got, "max_ms")
    if p99 is None or worst is None:
        return "—"
    ok = (p99 <= TARGET_P99_MS and worst <= TARGET_MAX_MS
          and not any(_med(got, k) for k in ("early", "twice", "lost")))
    return "met" if ok else "**not met**"


def lateness_rows(results: dict[str, dict[str, Any]], kinds: tuple[str, ...]
                  ) -> list[list[str]]:
    rows = []
    for case, by in results.items():
        if case.split()[0] not in kinds:
            continue
        for label, got in by.items():
            rows.append([case, _label(label), _ms(got, "publish_s"), _ms(got, "p50_ms"),
                         _ms(got, "p99_ms"), _ms(got, "max_ms"), _count(got, "early"),
                         _count(got, "twice"), _count(got, "lost"),
                         f"{got['ok_rounds']}/{len(got['rounds'])}", _verdict(got)])
    return rows


LATENESS_HEADERS = ["case", "system", "published in s", "lateness p50 ms", "p99 ms", "max ms",
                    "early", "twice", "lost", "rounds ok", f"p99 ≤ {TARGET_P99_MS:g}, max ≤ "
                    f"{TARGET_MAX_MS:g}, none early/twice/lost"]


def _head(data: dict[str, Any], title: str) -> str:
    m = data.get("machine") or {}
    load = None
    if m.get("load_average_at_start") and m.get("load_average_at_end"):
        load = (m["load_average_at_start"][0], m["load_average_at_end"][0])
    line = run_line(data.get("command", "python bench/bench_burst.py"), data.get("revision"),
                    data.get("finished_at"), m, load)
    return f"## {title}\n\n{line}"


def section_burst(data: dict[str, Any]) -> str:
    s = data["settings"]
    table = markdown_table(LATENESS_HEADERS, lateness_rows(data["results"],
                                                           ("burst", "spaced")), "llrrrrrrrrl")
    how = prose(f"""Countdowns published as fast as the producer processes can (burst) or one
every {s['spacing_ms']:g} ms from one producer (spaced), delays uniform over the span; one Celery
worker `prefork -c 4` or one Dramatiq worker (1 process × 4 threads) on delayq. Lateness = the
task's own `time.time()` at its start minus the eta its message carries; early = started before
it; twice = runs beyond the first; lost = not run within the last send + span +
{s['grace_s']:g} s. Medians of {s['rounds']} interleaved rounds, min–max in brackets. Issue 41's
target: p99 ≤ {TARGET_P99_MS:g} ms and max ≤ {TARGET_MAX_MS:g} ms, none early, twice or lost.""")
    return f"{_head(data, 'Countdowns in a burst')}\n\n{table}\n\n{how}\n"


def section_peers(data: dict[str, Any]) -> str:
    s, results = data["settings"], data["results"]
    by_case = {c.split(",")[0].split()[0] + ("_async" if "async" in c else ""): by
               for c, by in results.items()}
    labels = list(dict.fromkeys(label for by in results.values() for label in by))
    rows = []
    for label in labels:
        sync = by_case.get("drain", {}).get(label, {})
        asyn = by_case.get("drain_async", {}).get(label, {})
        burst = by_case.get("burst", {}).get(label, {})
        copy = by_case.get("copy", {}).get(label, {})
        rows.append([_label(label), _rate(sync, "jobs_per_s"), _rate(asyn, "jobs_per_s"),
                     _rate(sync, "sends_per_s"), _rate(copy, "rows_per_s"),
                     " / ".join(_ms(burst, k) for k in ("p50_ms", "p99_ms", "max_ms")),
                     " / ".join(_count(burst, k) for k in ("early", "twice", "lost"))])
    table = markdown_table(["system", "drain e2e jobs/s, sync producer", "async producer",
                            "sends/s (sync)", "COPY of the same rows, rows/s",
                            "burst lateness p50 / p99 / max ms", "early / twice / lost"],
                           rows, "lrrrrrr")
    short = [f"{_label(label)}, {case.split(',')[0]}: {', '.join(got['warm_up_short'])}"
             for case, by in results.items() for label, got in by.items()
             if got.get("warm_up_short")]
    if short:
        table += "\n\n" + prose("Measured after a warm-up of 20 no-ops that had not finished "
                                 "(of 20 run after 60 s): " + "; ".join(short) + ".")
    targets = peer_targets(by_case)
    how = prose(f"""One worker with concurrency 4 per system, a no-op job, each system in its own
fresh database on the same PostgreSQL. Drain: {s['drain_n']:,} no-ops enqueued one per call by
one producer process while the worker runs, first send to last run (a system still running
after {s.get('drain_limit_s', 180):g} s is stopped there: its rate is what ran by then).
Burst: the first size of the burst section from one producer. COPY: one process copying
{s['drain_n']:,} rows shaped like the one its producer enqueued, at the system's commit
setting (the limit an enqueue path could reach). Medians of {s['rounds']} interleaved rounds,
min–max in brackets.""")
    return (f"{_head(data, 'PostgreSQL-native peers')}\n\n{table}\n\n{targets}\n\n{how}\n\n"
            f"{prose(PEER_NOTES)}\n")


def _rate(got: dict[str, Any], name: str) -> str:
    fig = got.get(name)
    if fig is None:
        return "—"
    text = spread(fig["median"], fig["min"], fig["max"], "{:,.0f}")
    if name == "jobs_per_s" and got.get("partial"):
        text += f" (stopped: {'; '.join(got['partial'])})"
    return text


def peer_targets(by_case: dict[str, dict[str, Any]]) -> str:
    """Issue 41: burst p99 below every peer's best by 10×; the drain ≥ 3× the fastest peer
    through Dramatiq and ≥ 1.2× through Celery, with either producer API."""
    def best(case: str, name: str, pick: Any) -> float | None:
        values = [v for by in (by_case.get(c, {}) for c in case.split(","))
                  for label, got in by.items() if label.split()[0] in PEERS
                  if (v := _med(got, name)) is not None]
        return pick(values) if values else None

    checks = []
    peer_p99 = best("burst", "p99_ms", min)
    peer_rate = best("drain,drain_async", "jobs_per_s", max)
    for system, factor in (("dramatiq", 3.0), ("celery", 1.2)):
        p99 = _med(by_case.get("burst", {}).get(system, {}), "p99_ms")
        rate = _med(by_case.get("drain", {}).get(system, {}), "jobs_per_s")
        if p99 is not None and peer_p99:
            checks.append(f"{LABELS[system]} burst p99 {p99:,.1f} ms against the peers' best "
                          f"{peer_p99:,.1f} ms / 10 = {peer_p99 / 10:,.1f} ms: "
                          f"{'met' if p99 * 10 <= peer_p99 else '**not met**'}")
        if rate is not None and peer_rate:
            checks.append(f"{LABELS[system]} drain {rate / peer_rate:.2f}× the fastest peer ("
                          f"{peer_rate:,.0f} jobs/s; target "
                          f"{factor:g}×): {'met' if rate >= factor * peer_rate else '**not met**'}")
    return prose("Targets (issue 41): " + ("; ".join(checks) or "nothing to compare") + ".")


def section_many(data: dict[str, Any]) -> str:
    s, results = data["settings"], data["results"]
    rows = []
    burst_case = next((c for c in results if c.startswith("burst")), None)
    drain_case = next((c for c in results if c.startswith("drain")), None)
    labels = list(dict.fromkeys(label for by in results.values() for label in by))
    for label in labels:
        b = results.get(burst_case or "", {}).get(label, {})
        d = results.get(drain_case or "", {}).get(label, {})
        rows.append([_label(label), _ms(b, "p99_ms"), _ms(b, "max_ms"),
                     " / ".join(_count(b, k) for k in ("early", "twice", "lost")),
                     _rate(d, "jobs_per_s"),
                     f"{_count(b, 'notifications')} / {_count(d, 'notifications')}",
                     f"{_ms(b, 'pg_backends_cpu_s')} / {_ms(d, 'pg_backends_cpu_s')}",
                     f"{_ms(b, 'pg_aux_cpu_s')} / {_ms(d, 'pg_aux_cpu_s')}",
                     f"{_ms(b, 'workers_cpu_s')} / {_ms(d, 'workers_cpu_s')}",
                     f"{_pct(b)} / {_pct(d)}", _count(d, "listeners")])
    table = markdown_table(
        ["variant", "burst lateness p99 ms", "max ms", "early / twice / lost",
         "drain e2e jobs/s", "NOTIFYs burst / drain", "PG backends CPU s burst / drain",
         "PG WAL writer etc. CPU s", "workers CPU s", "max notify queue use",
         "LISTENing backends"], rows, "lrrrrrrrrrr")
    how = prose(f"""{s['layout'][0]} consumer processes on one queue: one Dramatiq worker
`-p {s['layout'][0]} -t {s['layout'][1]}` on delayq (one command forks them; Celery `-c 1` × 20
would be 20 main processes and 20 pool children for the same 20 consumers, twice the processes
on 2 cores), 4 producer processes. Burst: {burst_case}; drain: {drain_case}. NOTIFYs counted by
a LISTEN of the harness' own on delayq's channel (each listener receives each one once);
CPU seconds of this database's backends (the workers' sessions and the producers', sampled
every 0.25 s), of
PostgreSQL's WAL writer, checkpointer and background writer, and of the workers' processes,
over the phase; `pg_notification_queue_usage()` sampled every 0.2 s. Medians of
{s['rounds']} interleaved rounds, min–max in brackets.""")
    return f"{_head(data, 'Many workers on one queue')}\n\n{table}\n\n{how}\n"


def _pct(got: dict[str, Any]) -> str:
    value = _med(got, "queue_usage_max")
    return "—" if value is None else f"{value * 100:.4f} %"


RESULT_NAMES = {"burst": "burst", "peers": "peers", "many": "many_workers"}
TITLES = {"burst": section_burst, "peers": section_peers, "many": section_many}


def section(data: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md for a results document of any mode."""
    return TITLES[data["mode"]](data)


