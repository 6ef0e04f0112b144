"""The scenarios: one row each (what is measured, on which systems, at which sizes), and the
measurements they run. A measurement takes one run's state (``harness.Ctx``: a fresh state
of one system, ``ctx.params`` the row's sizes) and returns its figures, ``{name: number}``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from apps.steady import load_far_rows
from harness import (
    APPS_DIR,
    MB,
    TABLE,
    Ctx,
    NotifyMeter,
    Producers,
    checkpoint,
    execute,
    fresh_database,
    job,
    lateness,
    send,
    sends,
    server_cpu,
    start_worker,
    state,
    tree,
    tree_cpu,
    tree_rss,
    wait_done,
)
from psycopg import sql
from psycopg.types.json import Jsonb

Figures = dict[str, float]


def _per_task(seconds: float, n: int) -> float:
    return round(seconds * 1e6 / n)


def e2e(ctx: Ctx) -> Figures:
    """``n`` no-ops sent by ``producers`` processes (``threads`` each) while the worker runs:
    first send to last run, with each side's CPU per task. A system still running after
    ``limit_s`` is stopped there: its rate is what ran by then (``stopped`` 1)."""
    p = ctx.params
    limited = limit_sibling(ctx, p["sibling_limit"]) if "sibling_limit" in p else None
    worker = start_worker(ctx, p.get("layout"))
    key, n = ctx.k("e2e"), p["n"]
    notes = NotifyMeter(ctx.url) if p.get("notify") else None
    prods = Producers(ctx, [job(ctx, "noop", n, p["producers"], threads=p.get("threads", 1),
                                key=key)])
    server, worker0 = server_cpu(ctx.system, ctx.admin_url, ctx.url), tree_cpu([worker.pid])
    prods.go()
    done = wait_done(ctx, key, p["limit_s"], [worker])
    worker_s, server_s = tree_cpu([worker.pid]) - worker0, server()
    first = float(ctx.rc.get(f"{key}:sent0") or time.time())
    out: Figures = {}
    if done is None:
        ran = int(ctx.rc.get(key) or 0)
        prods.kill()
        out |= {"stopped": 1, "ran": ran, "tasks_per_s": round(ran / (time.time() - first), 1)}
        n = max(ran, 1)
    else:
        prods.wait(120)
        last = sends(ctx, key)[1]
        out |= {"tasks_per_s": round(n / (done - first), 1),
                "sends_per_s": round(n / (last - first), 1)}
        if not ctx.system.inproc:
            out["producers_us"] = _per_task(sum(
                float(c) for c in ctx.rc.lrange(f"{key}:cpu", 0, -1)), n)
    out |= {"worker_us": _per_task(worker_s, n), "server_us": _per_task(server_s, n)}
    if notes is not None:
        out["notifications"] = notes.close()
    return out | (limited or {})


#: The queue :func:`limit_sibling` limits: no task of the run is of it.
SIBLING = "bench-limited"


def limit_sibling(ctx: Ctx, concurrency: int) -> Figures:
    """A concurrency limit put on :data:`SIBLING` through the public API of the delayq
    measured (its schema made first), so that the run's own queue is claimed beside a
    controlled one (issue 52: free when unused). ``sibling_limit``: the limit set, 0 when that
    revision has no controls (before issue 52) and nothing was set."""
    code = ("import json, sys; from delayq_transport import DelayedQueue\n"
            "q = DelayedQueue(sys.argv[1]); n = int(sys.argv[3]) if hasattr(q, 'limit') else 0\n"
            "if n: q.limit(sys.argv[2], concurrency=n)\n"
            "q.close(); print(json.dumps({'sibling_limit': n}))")
    return _app(ctx, "-c", code, ctx.url or "", SIBLING, str(concurrency), timeout=120)


def drain(ctx: Ctx) -> Figures:
    """The worker alone: ``n`` no-ops queued first, then drained: first run to last (the
    worker's start-up left out; a Dramatiq worker's processes report ready one by one)."""
    p, key = ctx.params, ctx.k("drain")
    send(ctx, [job(ctx, "noop", p["n"], p["producers"], key=key)]).wait(600)
    worker = start_worker_cold(ctx)
    cpu0 = tree_cpu([worker.pid])
    done = wait_done(ctx, key, p["limit_s"], [worker])
    if done is None:
        raise RuntimeError(f"{ctx.system.name}: the drain did not end in {p['limit_s']} s")
    seconds = done - float(ctx.rc.get(f"{key}:first") or 0)
    return {"tasks_per_s": round(p["n"] / seconds, 1), "seconds": round(seconds, 3),
            "worker_us": _per_task(tree_cpu([worker.pid]) - cpu0, p["n"])}


def start_worker_cold(ctx: Ctx) -> Any:
    """A worker whose ready line is seen, without a warm-up (it would queue behind a backlog)."""
    from harness import Proc
    from systems import worker_command

    cmd, ready, count = worker_command(ctx.system, ctx.queue, ctx.params.get("layout"))
    proc = Proc(cmd, ctx.env, ctx.log("cold"))
    ctx.procs.append(proc)
    proc.wait_for_line(ready or "", count)
    return proc


def _runs(ctx: Ctx, keys: list[tuple[str, int]], until: float) -> None:
    """Wait until every ``timed`` task of ``keys`` ran or ``until`` passed (then 2 s more:
    a late duplicate)."""
    while time.time() < until:
        if all(ctx.rc.llen(f"{k}:runs") >= n for k, n in keys):
            time.sleep(min(2.0, max(0.0, until - time.time())))
            return
        time.sleep(0.1)


def latency(ctx: Ctx) -> Figures:
    """One producer sending an immediate task every ``span_s / immediate`` s (pick-up: start
    - send) while another sends a countdown every ``span_s / countdowns`` s, delays uniform in
    ``[low_s, high_s)`` (lateness: start - due); lost: not run ``grace_s`` after the last due."""
    p = ctx.params
    start_worker(ctx, p.get("layout"))
    now, later = ctx.k("now"), ctx.k("later")
    prods = send(ctx, [
        job(ctx, "timed", p["immediate"], key=now, spacing_s=p["span_s"] / p["immediate"]),
        job(ctx, "timed", p["countdowns"], key=later, spacing_s=p["span_s"] / p["countdowns"],
            low_s=p["low_s"], high_s=p["high_s"], seed=41)])
    prods.wait(p["span_s"] + 120)
    _runs(ctx, [(now, p["immediate"]), (later, p["countdowns"])],
          sends(ctx, later)[1] + p["high_s"] + p["grace_s"])
    return {**lateness(ctx.rc.lrange(f"{now}:runs", 0, -1), p["immediate"], "pickup_"),
            **lateness(ctx.rc.lrange(f"{later}:runs", 0, -1), p["countdowns"])}


def burst(ctx: Ctx) -> Figures:
    """``n`` countdowns sent as fast as ``producers`` processes can, delays uniform over
    ``span_s``: lateness, and how many ran early, twice or never."""
    p = ctx.params
    start_worker(ctx, p.get("layout"))
    notes = NotifyMeter(ctx.url) if p.get("notify") else None
    key = ctx.k("burst")
    send(ctx, [job(ctx, "timed", p["n"], p["producers"], key=key, high_s=p["span_s"],
                   seed=41)]).wait(p["span_s"] + 900)
    first, last = sends(ctx, key)
    _runs(ctx, [(key, p["n"])], last + p["span_s"] + p["grace_s"])
    out = {**lateness(ctx.rc.lrange(f"{key}:runs", 0, -1), p["n"]),
           "publish_s": round(last - first, 3)}
    if notes is not None:
        out["notifications"] = notes.close()
    return out


def kill(ctx: Ctx) -> Figures:
    """Two workers run; ``n`` tasks of ``hold_s`` each are sent; the worker that started the
    first is killed (SIGKILL, with its children). How long until its started tasks start again
    on the other, and, ``bound_s`` after the kill, how many never finished (lost) or finished
    more than once (twice)."""
    p = ctx.params
    workers = [start_worker(ctx, tag=f"kill{i}") for i in (0, 1)]
    key = ctx.k("sleepy")
    send(ctx, [job(ctx, "sleepy", p["n"], key=key, seconds=p["hold_s"])]).wait(60)
    deadline = time.monotonic() + 60
    while not ctx.rc.llen(f"{key}:starts"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{ctx.system.name}: no sleepy task started")
        time.sleep(0.02)
    pid = int(ctx.rc.lindex(f"{key}:starts", 0).split()[2])
    victim = next(w for w in workers if pid in {q.pid for q in tree(w.pid)})
    gone = {q.pid for q in tree(victim.pid)}
    killed_at = time.time()
    victim.kill()
    until = killed_at + p["bound_s"]
    while time.time() < until and len(set(_ends(ctx, key))) < p["n"]:
        time.sleep(0.1)
    time.sleep(1.0)
    starts = [(int(i), float(t), int(q)) for i, t, q in
              (line.split() for line in ctx.rc.lrange(f"{key}:starts", 0, -1))]
    killed = {i for i, t, q in starts if q in gone and t < killed_at}
    again = {i: min(t for j, t, _ in starts if j == i and t > killed_at) for i in killed
             if any(j == i and t > killed_at for j, t, _ in starts)}
    ends = _ends(ctx, key)
    out: Figures = {"lost": p["n"] - len(set(ends)), "twice": len(ends) - len(set(ends)),
                    "killed_tasks": len(killed)}
    if killed and len(again) == len(killed):
        out["rerun_s"] = round(max(again.values()) - killed_at, 2)
    return out


def _ends(ctx: Ctx, key: str) -> list[int]:
    return [int(line.split()[0]) for line in ctx.rc.lrange(f"{key}:ends", 0, -1)]


def hold(ctx: Ctx) -> Figures:
    """Worker memory idle, then once ``n`` one-hour countdowns are sent and it settled
    (5 samples a second apart within 1 MB, after at least ``settle_s``, at most 60 s)."""
    p = ctx.params
    worker = start_worker(ctx)
    samples = []
    for _ in range(5):
        time.sleep(1.0)
        samples.append(tree_rss(worker.pid))
    idle = statistics.median(samples)
    send(ctx, [job(ctx, "noop", p["n"], p["producers"], delay_s=3600.0)]).wait(900)
    started, rss = time.monotonic(), [tree_rss(worker.pid)]
    while time.monotonic() - started < 60:
        time.sleep(1.0)
        rss.append(tree_rss(worker.pid))
        if time.monotonic() - started >= p["settle_s"] and max(rss[-5:]) - min(rss[-5:]) < MB:
            break
    if not worker.alive():
        raise RuntimeError(f"{ctx.system.name}: the worker died holding the countdowns")
    return {"idle_mb": round(idle / MB, 1), "after_mb": round(rss[-1] / MB, 1)}


#: Each PostgreSQL system's queue table, and a column a copied row must vary (a unique key).
COPY_TABLES = {"delayq": (TABLE, "pKey"), "pgqueuer": ("pgqueuer", None),
               "procrastinate": ("procrastinate_jobs", None)}


def copy(ctx: Ctx) -> Figures:
    """One process COPYing ``n`` rows shaped like the one the system's producer just wrote
    (a one-hour countdown, no worker running) into its table, at its commit setting."""
    n = ctx.params["n"]
    send(ctx, [job(ctx, "noop", 1, delay_s=3600.0)]).wait(120)
    table, vary = COPY_TABLES[ctx.system.broker]
    assert ctx.url is not None
    with psycopg.connect(ctx.url, autocommit=True) as conn:
        cols = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
            " AND table_schema = current_schema() AND is_identity = 'NO'"
            " AND coalesce(column_default, '') NOT LIKE 'nextval(%%'"
            " ORDER BY ordinal_position", [table])]
        names = sql.SQL(", ").join(map(sql.Identifier, cols))
        row = conn.execute(sql.SQL("SELECT {} FROM {} LIMIT 1").format(
            names, sql.Identifier(table))).fetchone()
        assert row is not None, f"no row in {table} to copy"
        if ctx.system.delayq or ctx.system.relaxed:
            conn.execute("SET synchronous_commit = off")
        one = [Jsonb(v) if isinstance(v, dict | list) else v for v in row]
        rows = [list(one) for _ in range(n)]
        if vary is not None:
            at = cols.index(vary)
            for i, r in enumerate(rows):
                r[at] = f"{one[at]}-{i}"
        start = time.perf_counter()
        with conn.transaction(), conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                sql.Identifier(table), names)) as out:
            for r in rows:
                out.write_row(r)
        return {"rows_per_s": round(n / (time.perf_counter() - start))}


# -- delayq with millions of waiting rows, with a held snapshot, in Spark --------------------


def _schema(ctx: Ctx, url: str, queue: str) -> None:
    """The queue table made by the library measured (a revision's own migrations)."""
    code = ("import sys; from delayq_transport import DelayedQueue; "
            "DelayedQueue(sys.argv[1], kind=sys.argv[2]).close()")
    subprocess.run([sys.executable, "-c", code, url, queue], env=ctx.env, check=True)


def _on(ctx: Ctx, url: str, queue: str, tag: str) -> Ctx:
    """``ctx`` pointed at another database and queue (one the scenario prepared)."""
    from systems import app_env

    return Ctx(ctx.system, ctx.admin_url, {**ctx.env, **app_env(ctx.system, url, queue)}, url,
               queue, ctx.k(tag), ctx.logdir, ctx.params, ctx.tree, ctx.rc, ctx.procs)


def scale(ctx: Ctx) -> Figures:
    """The drain of ``n`` no-ops with ``rows`` far-future rows waiting in the consumed queue,
    paired with the drain of a reference holding ``ref_rows`` in the same minutes (order
    alternating by round). The tables are built once per revision and kept for its rounds."""
    p, cache = ctx.params, ctx.params["_cache"]
    if "scale" not in cache:
        made = {}
        for side, rows in (("big", p["rows"]), ("ref", p["ref_rows"])):
            url = cache["_stack"].enter_context(fresh_database(ctx.admin_url, "bench_scale"))
            _schema(ctx, url, "scale")
            load_far_rows(url, "scale", rows)
            made[side] = url
        cache["scale"] = made
    seconds = {}
    for side in (("ref", "big") if p["_round"] % 2 else ("big", "ref")):
        url = cache["scale"][side]
        execute(url, 'DELETE FROM delayed_queue WHERE "pKey" NOT LIKE %s', ["far-%"])
        checkpoint(ctx.admin_url)
        at = _on(ctx, url, "scale", side)
        at.params = {**p, "producers": 2}
        seconds[side] = drain(at)["seconds"]
        for proc in at.procs:
            proc.kill()
        at.procs.clear()
    return {"drain_s": seconds["big"], "ref_drain_s": seconds["ref"],
            "ratio": round(seconds["big"] / seconds["ref"], 3)}


@contextlib.contextmanager
def _snapshot(url: str) -> Any:
    """A REPEATABLE READ transaction that read the table, held: as a long pg_dump does."""
    with psycopg.connect(url) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM delayed_queue WHERE false")
        yield


def _steady(ctx: Ctx, held: bool) -> Figures:
    """``rate`` tasks/s for ``seconds`` (pick-up of each), then a drain of ``n`` no-ops."""
    p = ctx.params
    start_worker(ctx)
    key, total = ctx.k("steady"), int(p["rate"] * p["seconds"])
    assert ctx.url is not None
    with _snapshot(ctx.url) if held else contextlib.nullcontext():
        send(ctx, [job(ctx, "timed", total, key=key, spacing_s=1 / p["rate"])]).wait(
            p["seconds"] + 120)
        _runs(ctx, [(key, total)], time.time() + 30)
        lines = ctx.rc.lrange(f"{key}:runs", 0, -1)
        third = total // 3
        late = [lateness([x for x in lines if int(x.split()[0]) < third], third),
                lateness([x for x in lines if int(x.split()[0]) >= total - third], third)]
        after = e2e(_fresh_key(ctx, {"n": p["n"], "producers": 2, "limit_s": 120}))
    return {**lateness(lines, total, "pickup_"), "first_p99_ms": late[0]["p99_ms"],
            "last_p99_ms": late[1]["p99_ms"], "drain_tasks_per_s": after["tasks_per_s"]}


def _fresh_key(ctx: Ctx, params: Mapping[str, Any]) -> Ctx:
    """The same state under new keys and sizes (a second measurement on the running worker
    would start another: e2e starts its own, on the same database)."""
    return Ctx(ctx.system, ctx.admin_url, ctx.env, ctx.url, ctx.queue, ctx.k("after"),
               ctx.logdir, dict(params), ctx.tree, ctx.rc, ctx.procs)


def snapshot(ctx: Ctx) -> Figures:
    """:func:`_steady` without and with a snapshot held throughout, each on a fresh database,
    the order alternating by round: the held run's figures carry ``held_``."""
    out: Figures = {}
    for held in ((True, False) if ctx.params["_round"] % 2 else (False, True)):
        with state(ctx.system, ctx.tree, ctx.admin_url, ctx.logdir, ctx.params) as run:
            got = _steady(run, held)
        out |= {("held_" if held else "") + k: v for k, v in got.items()}
    return out


def _app(ctx: Ctx, *args: str, timeout: float = 1800) -> Figures:
    """The figures an app script prints as JSON, run in a process of the revision measured."""
    done = subprocess.run([sys.executable, *args], cwd=APPS_DIR, env=ctx.env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args[:2])}: {done.stderr[-2000:]}")
    figures: Figures = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def spark(ctx: Ctx) -> Figures:
    """``schedule_tasks`` (first run and re-run) or, for the ``copy`` row, one process COPYing
    the same rows (apps/spark_app.py)."""
    what = "copy" if ctx.system.framework == "copy" else "schedule"
    return _app(ctx, "spark_app.py", what, ctx.url or "", str(ctx.params["rows"]))


def churn(ctx: Ctx) -> Figures:
    """The queue core under ``rate`` rows/s for ``seconds`` with ``far_rows`` waiting
    (apps/steady.py): the first and last third's rate, pick-up and poll p99, table size."""
    p = ctx.params
    return _app(ctx, "steady.py", ctx.url or "", str(p["seconds"]), str(p["rate"]),
                str(p["far_rows"]), timeout=p["seconds"] + 1800)


# -- the table -------------------------------------------------------------------------------

CELERY = ("celery-delayq", "celery-redis", "celery-rabbitmq")
PGBOUNCER = ("celery-delayq-pgbouncer", "celery-delayq-pgbouncer-listen")
DRAMATIQ = ("dramatiq-delayq", "dramatiq-redis", "dramatiq-rabbitmq")
DJANGO = ("django-delayq", "django-delayq-tuned", "django-tasks-db", "django-ox",
          "django-ox-tuned", "django-task-psql", "django-task-psql-tuned")
PEERS = ("pgqueuer", "pgqueuer-relaxed", "procrastinate", "procrastinate-relaxed")


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    measure: Callable[[Ctx], Figures]
    systems: tuple[str, ...]
    params: Mapping[str, Any]
    #: What ``--quick`` changes: a smoke run of every scenario in a few minutes.
    quick: Mapping[str, Any] = field(default_factory=dict)
    #: Rounds whatever the run's (a scenario whose figures are set by timeouts, not noise).
    rounds: int | None = None
    #: Per system: options the scenario adds to the row's (the killed worker's leases).
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


E2E = {"n": 10_000, "producers": 2, "limit_s": 30}
LATENCY = {"immediate": 300, "countdowns": 180, "span_s": 6, "low_s": 2, "high_s": 6,
           "grace_s": 30}
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("e2e", "end to end", e2e,
             (*CELERY, "celery-delayq-durable", "celery-rabbitmq-confirm", "celery-memory",
              *PGBOUNCER,
              *DRAMATIQ, "dramatiq-postgres", "dramatiq-stub", *DJANGO, *PEERS),
             E2E, {"n": 1_000, "limit_s": 20}),
    Scenario("e2e-sibling", "end to end, another queue under a concurrency limit", e2e,
             ("celery-delayq", "dramatiq-delayq", "django-delayq"),
             {**E2E, "sibling_limit": 3}, {"n": 1_000, "limit_s": 20}),
    Scenario("e2e-threads", "end to end, producers publishing from 8 threads each", e2e,
             (*CELERY, "celery-delayq-durable", "celery-rabbitmq-confirm"),
             {**E2E, "threads": 8}, {"n": 1_000, "limit_s": 20}),
    Scenario("drain", "the worker alone draining a backlog", drain,
             (*CELERY, *DRAMATIQ, "dramatiq-postgres"), {"n": 10_000, "producers": 2,
                                                         "limit_s": 300}, {"n": 1_000}),
    Scenario("latency", "pick-up and spaced countdowns", latency,
             (*CELERY, *PGBOUNCER, *DRAMATIQ, *DJANGO, "pgqueuer", "procrastinate"), LATENCY,
             {"immediate": 50, "countdowns": 30, "span_s": 3, "low_s": 1, "high_s": 3,
              "grace_s": 10}),
    Scenario("burst", "a burst of countdowns, 1 producer", burst,
             ("celery-delayq", "dramatiq-delayq", "django-delayq", "pgqueuer", "procrastinate"),
             {"n": 2_000, "span_s": 20, "producers": 1, "grace_s": 60},
             {"n": 200, "span_s": 3, "grace_s": 10}),
    Scenario("burst-4", "a burst of countdowns, 4 producers", burst,
             ("celery-delayq", "dramatiq-delayq"),
             {"n": 2_000, "span_s": 20, "producers": 4, "grace_s": 60},
             {"n": 200, "span_s": 3, "grace_s": 10}),
    Scenario("burst-10k", "a burst of 10,000 countdowns, 4 producers", burst,
             ("celery-delayq", "dramatiq-delayq"),
             {"n": 10_000, "span_s": 30, "producers": 4, "grace_s": 60},
             {"n": 400, "span_s": 3, "grace_s": 10}),
    Scenario("many-burst", "20 worker processes: a burst of countdowns, 4 producers", burst,
             ("dramatiq-delayq",), {"n": 2_000, "span_s": 20, "producers": 4, "grace_s": 60,
                                    "layout": (20, 1), "notify": True},
             {"n": 200, "span_s": 3, "grace_s": 10, "layout": (4, 1)}),
    Scenario("many-e2e", "20 worker processes: end to end, 4 producers", e2e,
             ("dramatiq-delayq",), {**E2E, "producers": 4, "layout": (20, 1), "notify": True},
             {"n": 1_000, "limit_s": 20, "layout": (4, 1)}),
    Scenario("kill", "a killed worker", kill,
             (*CELERY, *DJANGO), {"n": 4, "hold_s": 3, "bound_s": 75},
             {"bound_s": 25}, rounds=1,
             options={"celery-delayq": {"acquire_timeout": 10},
                      "celery-redis": {"visibility_timeout": 10,
                                       "unacked_restore_throttle": 1}},
             env={"BENCH_ACKS_LATE": "1"}),
    Scenario("hold", "one-hour countdowns waiting", hold, (*CELERY, *DRAMATIQ),
             {"n": 50_000, "producers": 4, "settle_s": 15}, {"n": 2_000, "settle_s": 3},
             rounds=1),
    Scenario("copy", "one process COPYing the rows a producer writes", copy,
             ("celery-delayq", "dramatiq-delayq", *PEERS), {"n": 10_000}, {"n": 1_000}),
    Scenario("scale", "millions of waiting rows", scale, ("celery-delayq",),
             {"n": 5_000, "rows": 5_000_000, "ref_rows": 10_000, "limit_s": 300},
             {"n": 500, "rows": 100_000, "ref_rows": 1_000}),
    Scenario("snapshot", "a held snapshot", snapshot, ("celery-delayq",),
             {"rate": 150, "seconds": 180, "n": 3_000}, {"rate": 50, "seconds": 6, "n": 300},
             rounds=1),
    Scenario("spark", "Spark `schedule_tasks` against COPY", spark, ("spark-delayq", "copy"),
             {"rows": 1_000_000}, {"rows": 20_000}),
    Scenario("churn", "the queue core under a steady load", churn, ("core-delayq",),
             {"seconds": 600, "rate": 300, "far_rows": 1_000_000},
             {"seconds": 20, "rate": 100, "far_rows": 10_000}, rounds=1),
)
BY_NAME = {s.name: s for s in SCENARIOS}
