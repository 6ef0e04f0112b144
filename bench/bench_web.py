"""``delayq web`` at size: every page and API call of the web page, timed over HTTP against a
real ``delayq web`` server process, on a queue table of 5M rows, in two datasets:

* **much due**: 4 queues, a 50k-row due backlog, the rest spread over 30 days;
* **nothing due**: every row due within a day, none yet (the first one an hour from the build),
  where the overview's due count once read the whole table (issue 38).

Both have 200 rows in flight, 1,000 Dramatiq dead letters, a daily beat entry in the busiest
queue and ~300-byte Celery messages; built with generate_series, then VACUUM ANALYZE. Each round
calls every endpoint once, in the same order, and rounds are repeated (interleaved) so
background load hits all endpoints alike; the table reports the median and the worst round.

    flock /tmp/delayq-bench.lock python bench/bench_web.py --rows 5000000
    python bench/bench_web.py --rows 50000 --rounds 2 --no-search --no-update-docs  # smoke

``--only-bulk`` measures the bulk actions alone, on the nothing-due dataset (where a 10-minute
bar holds ~35,000 rows at 5M): each runs in the background (``web/jobs.py``), so the results
have the POST, every status poll, the reads (overview, task list) made while the job runs and
after it ended, and the job's own collection and write times per row
(bench/results/web_bulk.json and its section of docs/benchmarks.md).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import click
import httpx
import psycopg
from _common import (
    TargetRow,
    command_line,
    fresh_database,
    git_revision,
    load_results,
    machine_info,
    markdown_table,
    prose,
    run_line,
    verdict,
    write_results,
)
from _targets import replace_section
from _web_search import END_NEEDLE
from _web_search import lines as search_lines
from _web_search import phase as search_phase

from delayq_transport import Database, migrate

KINDS = ["celery", "celery\x06\x163", "mail", "reports"]
TARGET_MS = 300
DEAD_LETTER = json.dumps({
    "queue_name": "default", "actor_name": "app.charge", "args": [{"user": 123456}],
    "kwargs": {}, "message_id": "0b7e6a5c-0000-4000-8000-000000000000",
    "message_timestamp": 1700000000000,
    "options": {"retries": 20, "delayq_exception": "ValueError: card declined",
                "traceback": "Traceback (most recent call last):\n" + '  File "app.py", line 1\n'
                * 30 + "ValueError: card declined\n"}}).encode()


def payload(task: str, args: list[Any]) -> bytes:
    body = json.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None,
                                  "chord": None}]).encode()
    return json.dumps({
        "body": base64.b64encode(body).decode(), "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": task, "id": "x", "eta": None, "retries": 0,
                    "argsrepr": repr(tuple(args)), "kwargsrepr": "{}"},
        "properties": {"body_encoding": "base64", "priority": 0,
                       "delivery_info": {"exchange": "", "routing_key": "celery"}},
    }).encode()


#: ETA of row g, per dataset (SQL over g and now): 1% due over the last hour and the rest
#: over 30 days; or every row over the day that starts an hour after the build (a run of the
#: benchmark ends well within that hour, so nothing is due while it measures).
DATASETS = {
    "much due": "CASE WHEN g %% 100 = 0 THEN %(now)s - (g %% 3600000)"
                " ELSE %(now)s + (g::bigint * 7919) %% 2592000000 END",
    "nothing due": "%(now)s + 3600000 + (g::bigint * 7919) %% 86400000",
}
#: Where the ETA window and the bulk preview (a week ahead; nothing due: 6 h) and the bulk
#: cancels (20 days; 12 h) look, per dataset: inside its rows' range.
AHEAD_MS = {"much due": (7 * 86_400_000, 20 * 86_400_000),
            "nothing due": (6 * 3_600_000, 12 * 3_600_000)}
BEAT = "celery.backend_cleanup"
BEAT_HASH = "0123456789abcdef"


def build(url: str, rows: int, dataset: str) -> dict[str, Any]:
    """``rows`` rows; indexes rebuilt after the insert (same definitions) to build fast."""
    started = time.perf_counter()
    with Database(url) as db:
        migrate(db, "delayed_queue")
    common = payload("app.remind", [{"user": 123456, "email": "someone@example.com"}])
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()
        assert row is not None
        now = row[0]
        indexes = [r[0] for r in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'delayed_queue'"
            " AND indexname LIKE '%%Index'")]
        conn.execute("ALTER TABLE delayed_queue SET UNLOGGED")
        conn.execute("ALTER TABLE delayed_queue DISABLE TRIGGER USER")
        for index in indexes:
            conn.execute("DROP INDEX " + index.split(" INDEX ")[1].split(" ON ")[0])
        conn.execute(
            """INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",
                                          "scheduledAtInitially", "createdAt")
               SELECT md5(g::text), (%(kinds)s::text[])[1 + g %% 4], %(payload)s, at, at, %(now)s
               FROM generate_series(1, %(rows)s) AS g, LATERAL (
                   SELECT """ + DATASETS[dataset] + """) AS a(at)""",
            {"kinds": KINDS, "payload": common, "now": now, "rows": rows})
        conn.execute("SET maintenance_work_mem = '512MB'")
        for index in indexes:
            conn.execute(index)
        conn.execute("""UPDATE delayed_queue SET "lockUuid" = md5(id::text)::uuid::text,
                        "scheduledAt" = %(now)s + 3600000 WHERE id %% 25000 = 7""", {"now": now})
        needle = payload("app.other", [{"user": 42, "email": "needle@example.com"}])
        conn.execute("""UPDATE delayed_queue SET "payload" = %(p)s WHERE id %% 500000 = 11""",
                     {"p": needle})
        # 1,000 Dramatiq dead letters (the dead-letters page), failed over the last day.
        conn.execute("""UPDATE delayed_queue SET "pKind" = 'dramatiq:default.XQ',
                        "payload" = %(p)s, "scheduledAtInitially" = %(now)s - id %% 86400000,
                        "scheduledAt" = %(now)s + 604800000 - id %% 86400000
                        WHERE id %% 5000 = 17""", {"p": DEAD_LETTER, "now": now})
        add_beat_entry(conn, url, now)
        conn.execute("ALTER TABLE delayed_queue ENABLE TRIGGER USER")
        conn.execute("VACUUM ANALYZE delayed_queue")
        dead = conn.execute("""SELECT "id" FROM delayed_queue
                               WHERE "pKind" = 'dramatiq:default.XQ' LIMIT 1""").fetchone()
        some = conn.execute("""SELECT "id", "pKey" FROM delayed_queue WHERE "lockUuid" IS NULL
                               AND id % 1000 = 3 LIMIT 60""").fetchall()
        row = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('delayed_queue'))"
                           ).fetchone()
        assert row is not None
        size = row[0]
    return {"now": now, "rows": rows, "build_s": time.perf_counter() - started, "size": size,
            "window_ahead_ms": AHEAD_MS[dataset][0], "bulk_ahead_ms": AHEAD_MS[dataset][1],
            "ids": [r[0] for r in some], "keys": [r[1] for r in some],
            "dead_id": dead[0] if dead else 0}


def add_beat_entry(conn: psycopg.Connection[Any], url: str, now: int) -> None:
    """A daily beat entry, installed 3 days ahead in the celery queue (the beat page lists its
    next occurrences), as delayq_beat records it."""
    from delayq_beat.store import BeatStore, InstalledEntry

    common = payload("celery.backend_cleanup", [])
    for day in range(3):
        at = now + 3 * 3_600_000 + day * 86_400_000
        conn.execute("""INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",
                                                   "scheduledAtInitially", "createdAt")
                        VALUES (%s, 'celery', %s, %s, %s, %s)""",
                     (f"{BEAT}/{BEAT_HASH}/{at}", common, at, at, now))
    with Database(url) as db:
        BeatStore(db, "delayed_queue").record_installed(
            [InstalledEntry(BEAT, "celery", BEAT_HASH, now + 3 * 86_400_000, 0)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, DELAYQ_DATABASE_URL=url)
    proc = subprocess.Popen([sys.executable, "-m", "delayq_transport", "web", "--port",
                             str(port), "--refresh", "0"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/csrf", timeout=2)
            return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("delayq web did not start")


def endpoints(info: dict[str, Any], deep_cursor: str) -> list[tuple[str, str, str]]:
    from datetime import UTC, datetime, timedelta

    week = datetime.now(UTC) + timedelta(milliseconds=info["window_ahead_ms"])
    ids = info["ids"]
    return [
        ("overview page (24 h timeline)", "GET", "/"),
        ("overview page (7 d timeline)", "GET", "/?hours=168"),
        ("GET /api/overview", "GET", "/api/overview"),
        ("GET /api/timeline 7 d", "GET", "/api/timeline?hours=168&buckets=56"),
        ("task list, first page", "GET", "/tasks"),
        ("task list, deep page (cursor)", "GET", f"/tasks?cursor={deep_cursor}"),
        ("filter queue=mail", "GET", "/tasks?queue=mail"),
        ("filter state=due", "GET", "/tasks?state=due"),
        ("filter state=in_flight", "GET", "/tasks?state=in_flight"),
        ("filter state=redelivered (bounded scan)", "GET", "/tasks?state=redelivered"),
        ("filter task=app.other* (bounded scan)", "GET", "/tasks?task=app.other*"),
        ("ETA window (1 day, ahead)", "GET",
         f"/tasks?eta_after={week:%Y-%m-%dT%H:%M:%SZ}"
         f"&eta_before={week + timedelta(days=1):%Y-%m-%dT%H:%M:%SZ}"),
        ("GET /api/tasks?limit=500", "GET", "/api/tasks?limit=500"),
        ("task page", "GET", f"/tasks/{ids[0]}"),
        ("GET /api/tasks/{task id}", "GET", f"/api/tasks/{info['keys'][1]}"),
        ("watch page (6 ids)", "GET", "/watch?ids=" + ",".join(info["keys"][2:8])),
        ("beat page", "GET", "/beat"),
        ("dead letters page (1,000 dead letters)", "GET", "/dead-letters"),
        ("GET /api/dead-letters?queue=default", "GET", "/api/dead-letters?queue=default"),
        ("dead letter page (traceback)", "GET", f"/dead-letters/{info['dead_id']}"),
        ("workers page (200 leases)", "GET", "/workers"),
        ("GET /api/workers", "GET", "/api/workers"),
        ("bulk preview: all of a 1 h bar", "GET",
         f"/api/tasks/bulk/preview?all=1&eta_after={week:%Y-%m-%dT%H:%M:%SZ}"
         f"&eta_before={week + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}"),
        ("bulk preview: all of queue=mail (estimate)", "GET",
         "/api/tasks/bulk/preview?all=1&queue=mail"),
        ("bulk preview: 50 chosen rows", "GET",
         "/api/tasks/bulk/preview?ids=" + ",".join(map(str, ids[:50]))),
        ("POST bulk cancel: all of a 10-min bar", "POST", "bulk"),
        ("POST reschedule", "POST", "reschedule"),
        ("DELETE (cancel)", "DELETE", "cancel"),
    ]


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def run_rounds(base: str, eps: list[tuple[str, str, str]], info: dict[str, Any],
               rounds: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {name: [] for name, _, _ in eps}
    victims = list(info["ids"][10:])
    with httpx.Client(base_url=base, timeout=30) as client:
        token = client.get("/api/csrf").json()["csrf_token"]
        headers = {"X-CSRF-Token": token}
        for r in range(rounds + 1):  # round 0 warms up and is not recorded
            for name, method, path in eps:
                req: tuple[str, str, dict[str, Any]]
                if path == "bulk":  # a different 10-min bar each round, far ahead
                    lo = info["now"] + info["bulk_ahead_ms"] + r * 600_000
                    req = ("POST", "/api/tasks/bulk", {"json": {
                        "action": "cancel", "all": True, "eta_after": _iso(lo),
                        "eta_before": _iso(lo + 600_000)}})
                elif method == "POST":
                    req = ("POST", f"/api/tasks/{info['ids'][2]}/reschedule",
                           {"json": {"in": f"{3 + r}h"}})
                elif method == "DELETE":
                    req = ("DELETE", f"/api/tasks/{victims.pop()}", {})
                else:
                    req = ("GET", path, {})
                start = time.perf_counter()
                response = client.request(req[0], req[1], headers=headers, **req[2])
                elapsed = time.perf_counter() - start
                if response.status_code != 200:
                    raise RuntimeError(f"{name}: {response.status_code} {response.text[:200]}")
                if r:
                    timings[name].append(elapsed * 1000)
    return timings


@click.command()
@click.option("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
@click.option("--rows", default=5_000_000, show_default=True)
@click.option("--rounds", default=7, show_default=True)
@click.option("--datasets", default=",".join(DATASETS), show_default=True,
              help="Which datasets to build and measure, in this order")
@click.option("--search/--no-search", default=True,
              help="Measure the argument search too (on the much-due dataset)")
@click.option("--search-cap", default=120.0, show_default=True,
              help="Seconds a search without the index may take before it is reported as cut")
@click.option("--publishes", default=500, show_default=True,
              help="Publishes timed without and with the search index")
@click.option("--update-docs/--no-update-docs", default=True)
@click.option("--only-bulk", is_flag=True,
              help="Measure only the bulk actions (background jobs), on the nothing-due dataset")
def main(admin_url: str, rows: int, rounds: int, datasets: str, search: bool,
         search_cap: float, publishes: int, update_docs: bool, only_bulk: bool) -> None:
    if only_bulk:
        bulk_main(admin_url, rows)
        return
    chosen = [d.strip() for d in datasets.split(",") if d.strip()]
    unknown = set(chosen) - set(DATASETS)
    if unknown:
        raise click.BadParameter(f"unknown datasets {sorted(unknown)}: {list(DATASETS)}")
    load_before = os.getloadavg()
    measured: dict[str, dict[str, Any]] = {}
    searched = None
    machine = None
    for dataset in chosen:
        with fresh_database(admin_url, prefix="delayq_bench12_web") as url:
            machine = machine or machine_info(url)
            info = build(url, rows, dataset)
            print(f"{dataset}: built {rows:,} rows ({info['size']}) in {info['build_s']:.0f} s")
            timings, found = measure(url, info, rounds, search and dataset == "much due",
                                     search_cap, publishes)
            searched = found or searched
        results: dict[str, dict[str, Any]] = {
            name: {"median_ms": statistics.median(v), "max_ms": max(v), "samples": v}
            for name, v in timings.items()}
        measured[dataset] = {"table_size": info["size"], "build_s": info["build_s"],
                             "endpoints": results,
                             "worst_median_ms": max(r["median_ms"] for r in results.values())}
        for name, r in results.items():
            print(f"{dataset:12s} {name:45s} median {r['median_ms']:7.1f} ms  "
                  f"worst {r['max_ms']:7.1f} ms")
    load_after = os.getloadavg()
    data = {"command": command_line(), "revision": git_revision(), "machine": machine,
            "rows": rows, "rounds": rounds, "datasets": measured, "search": searched,
            "load_before": load_before, "load_after": load_after,
            "worst_median_ms": max(d["worst_median_ms"] for d in measured.values())}
    if searched:
        print(json.dumps(searched, indent=1))
    print(f"load average before {load_before}, after {load_after}")
    write_results("web", data)
    if update_docs:
        replace_section("web", section(load_results("web")))


def measure(url: str, info: dict[str, Any], rounds: int, search: bool, search_cap: float,
            publishes: int) -> tuple[dict[str, list[float]], dict[str, Any] | None]:
    """Every endpoint's timings against a ``delayq web`` on ``url``, and the search phase."""
    port = free_port()
    server = start_server(url, port)
    try:
        base = f"http://127.0.0.1:{port}"
        first = httpx.get(f"{base}/api/tasks?limit=500", timeout=30).json()
        deep = first["next_cursor"]
        for _ in range(20):  # 10,000 rows in
            deep = httpx.get(f"{base}/api/tasks?limit=500&cursor={deep}",
                             timeout=30).json()["next_cursor"] or deep
        timings = run_rounds(base, endpoints(info, deep), info, rounds)
        searched = search_phase(url, base, search_cap, publishes,
                                payload("app.other", [{"email": END_NEEDLE}])) \
            if search else None
    finally:
        server.terminate()
        server.wait(timeout=30)
    return timings, searched


#: Bulk actions measured by ``--only-bulk``: (name, action, extra fields, where the bar starts
#: after the dataset's bulk offset, its length). Disjoint ranges; the reschedule moves its rows
#: a day on, past every other range.
BULK_CASES = [
    ("cancel: all of a 10-min bar", "cancel", {}, 0, 600_000),
    ("reschedule +1d: all of a 10-min bar", "reschedule", {"shift": "+1d"}, 1_200_000, 600_000),
    ("cancel: all of a 2-h bar", "cancel", {}, 2_400_000, 7_200_000),
]
#: Status polls between two timed reads of the overview and the task list during a job.
READ_EVERY = 5


def bulk_main(admin_url: str, rows: int) -> None:
    load_before = os.getloadavg()
    with fresh_database(admin_url, prefix="delayq_bench42_bulk") as url:
        machine = machine_info(url)
        info = build(url, rows, "nothing due")
        print(f"nothing due: built {rows:,} rows ({info['size']}) in {info['build_s']:.0f} s")
        port = free_port()
        server = start_server(url, port)
        try:
            cases = bulk_cases(f"http://127.0.0.1:{port}", info)
        finally:
            server.terminate()
            server.wait(timeout=30)
    for name, c in cases.items():
        print(f"{name:40s} rows {c['rows']:>8,}  POST {c['post_ms']:6.1f} ms  status max "
              f"{max(c['status_ms']):6.1f} ms  reads max {max(c['reads_ms'] or [0]):6.1f} ms "
              f"(after {max(c['reads_after_ms']):6.1f})  "
              f"collect {c['collect_s']:6.2f} s  write {c['write_s']:6.2f} s = "
              f"{c['write_us_per_row']:5.1f} us/row (all {c['total_us_per_row']:5.1f})")
    data = {"command": command_line(), "revision": git_revision(), "machine": machine,
            "rows": rows, "dataset": "nothing due", "table_size": info["size"],
            "cases": cases, "load_before": load_before, "load_after": os.getloadavg()}
    write_results("web_bulk", data)


def bulk_cases(base: str, info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each bulk action once: the POST, every status poll until the job ends, the reads made
    meanwhile, and the job's collection and write times as the server recorded them."""
    out: dict[str, dict[str, Any]] = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        headers = {"X-CSRF-Token": client.get("/api/csrf").json()["csrf_token"]}
        for name, action, extra, offset, length in BULK_CASES:
            lo = info["now"] + info["bulk_ahead_ms"] + offset
            body = {"action": action, "all": True, "eta_after": _iso(lo),
                    "eta_before": _iso(lo + length), **extra}
            start = time.perf_counter()
            response = client.post("/api/tasks/bulk", headers=headers, json=body)
            post_ms = (time.perf_counter() - start) * 1000
            if response.status_code != 202:
                raise RuntimeError(f"{name}: {response.status_code} {response.text[:200]}")
            status_url = response.json()["status_url"]
            status_ms: list[float] = []
            reads_ms: list[float] = []
            deadline = time.monotonic() + 1800
            while True:
                start = time.perf_counter()
                job = client.get(status_url).json()
                status_ms.append((time.perf_counter() - start) * 1000)
                if job["finished"]:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: not finished after 30 min: {job}")
                if len(status_ms) % READ_EVERY == 0:
                    for path in ("/", "/tasks"):
                        start = time.perf_counter()
                        client.get(path).raise_for_status()
                        reads_ms.append((time.perf_counter() - start) * 1000)
                time.sleep(0.1)
            if job["state"] != "done":
                raise RuntimeError(f"{name}: {job}")
            after_ms: list[float] = []  # the same reads once the job ended
            for _ in range(READ_EVERY):
                for path in ("/", "/tasks"):
                    start = time.perf_counter()
                    client.get(path).raise_for_status()
                    after_ms.append((time.perf_counter() - start) * 1000)
            result = job["result"]
            write_s = job["finished_at"] - job["applying_at"]
            total_s = job["finished_at"] - job["started_at"]
            out[name] = {
                "action": action, "rows": result["matched"], "done": result["done"],
                "in_flight": result["in_flight"], "gone": result["gone"], "post_ms": post_ms,
                "status_ms": status_ms, "reads_ms": reads_ms, "reads_after_ms": after_ms,
                "collect_s": job["applying_at"] - job["started_at"], "write_s": write_s,
                "write_us_per_row": write_s / max(result["matched"], 1) * 1e6,
                "total_us_per_row": total_s / max(result["matched"], 1) * 1e6}
    return out
def _datasets(data: dict[str, Any]) -> dict[str, Any]:
    # Results from before the nothing-due dataset hold the much-due one alone.
    return data.get("datasets") or {"much due": {
        "endpoints": data["endpoints"], "table_size": data["table_size"]}}


def _fast(r: dict[str, Any]) -> bool:
    """Under the target, judged on the median as shown (whole ms)."""
    return round(r["median_ms"]) < TARGET_MS


def targets(data: dict[str, Any]) -> list[TargetRow]:
    """This run's row of the page's "Targets at a glance"."""
    measured = [(name, endpoint, r) for name, d in _datasets(data).items()
                for endpoint, r in d["endpoints"].items() if r]
    slow = [f"{endpoint} ({name}, {r['median_ms']:.0f} ms)" for name, endpoint, r in measured
            if not _fast(r)]
    fast = [r for _, _, r in measured if _fast(r)]
    text = (f"the others: slowest median {max(r['median_ms'] for r in fast):.0f} ms, worst "
            f"round {max(r['max_ms'] for r in fast):.0f} ms") if fast else ""
    return [TargetRow(
        "web", f"every page and API call < {TARGET_MS} ms at {data['rows']:,} rows, in every "
        "dataset (argument search apart)",
        "; ".join(p for p in [f"over it: {', '.join(slow)}" if slow else "", text] if p),
        verdict(not slow))]


#: A bulk cancel's write per row that issue 38 measured and issue 42 asks to keep.
BULK_CANCEL_US = 20


def bulk_section(data: dict[str, Any]) -> str:
    """The bulk actions' section (``--only-bulk``): every request of a job against the page's
    target, and the write per row."""
    rows = []
    for name, c in data["cases"].items():
        reads = c["reads_ms"] + c["reads_after_ms"]
        slowest = max([c["post_ms"], *c["status_ms"], *reads])
        per_row = (f"{c['write_us_per_row']:.1f}", f"{c['total_us_per_row']:.1f}")
        write_ok = c["action"] != "cancel" or round(c["write_us_per_row"], 1) <= BULK_CANCEL_US
        rows.append([name, f"{c['rows']:,}", f"{c['post_ms']:.0f}", f"{max(c['status_ms']):.0f}",
                     f"{max(c['reads_ms'], default=0):.0f}",
                     f"{max(c['reads_after_ms'], default=0):.0f}", *per_row,
                     verdict(round(slowest) < TARGET_MS and write_ok)])
    table = markdown_table(
        ["action", "rows", "POST ms", "status max ms", "reads during, max ms",
         "reads after, max ms", "write µs/row", "with collection µs/row",
         f"every request < {TARGET_MS} ms, cancel ≤ {BULK_CANCEL_US} µs/row"], rows,
        "lrrrrrrrc")
    load = (data["load_before"][0], data["load_after"][0])
    how = prose(f"""
A bulk action above the page's background threshold, on the *nothing due* dataset of
{data['rows']:,} rows ({data['table_size']}): the POST answers at once with a job, the page
polls its status, and the overview and the task list are read every {READ_EVERY} polls while
it runs and ten times after it ended. The job collects the matching rows, then writes them in
batches, each its own transaction. The first read of a range a large cancel emptied walks the
deleted rows' index entries until a vacuum or a read clears them.""")
    return f"""## Bulk actions at {data['rows']:,} rows (`bench/bench_web.py --only-bulk`)

{run_line(data.get("command", "python bench/bench_web.py --only-bulk"), data.get("revision"),
          data.get("finished_at"), data.get("machine"), load)}

{table}

{how}"""


def section(data: dict[str, Any]) -> str:
    """The web page's section of docs/benchmarks.md from a results document."""
    if data.get("benchmark") == "web_bulk":
        return bulk_section(data)
    datasets = _datasets(data)
    names = list(datasets)
    endpoints = list(datasets[names[0]]["endpoints"])
    header = ["endpoint"]
    for name in names:
        header += [f"{name}: median ms", "worst round ms"]
    header.append(f"< {TARGET_MS} ms")
    rows = []
    for endpoint in endpoints:
        found = [datasets[n]["endpoints"].get(endpoint) for n in names]
        row = [endpoint]
        for r in found:
            row += [f"{r['median_ms']:.0f}", f"{r['max_ms']:.0f}"] if r else ["-", "-"]
        row.append(verdict(all(r and _fast(r) for r in found)))
        rows.append(row)
    table = markdown_table(header, rows, "l" + "rr" * len(names) + "c")
    load = (data["load_before"][0], data["load_after"][0])
    command = data.get("command", "python bench/bench_web.py")
    sizes = ", ".join(f"{n} {d['table_size']}" for n, d in datasets.items())
    how = prose(f"""
Every page and API call of `delayq web`, over HTTP against a `delayq web` server process, on a
queue table of {data['rows']:,} rows ({sizes}), in each dataset measured: *much due* (4
queues, a 50k-row due backlog, the rest spread over 30 days) and *nothing due* (every row due
within a day, none yet); both with 200 rows in flight, 1,000 dead letters and a daily beat
entry. {data['rounds']} interleaved rounds after a warm-up, median and worst round (which
carries the machine's background load). Target: every call < {TARGET_MS} ms in every dataset
(the argument search is measured on its own, below). Filters the index cannot answer
(state=redelivered, task name) scan for at most 150 ms / 5,000 rows per request and say on the
page where they stopped; counts are exact up to 5,000 per queue, estimates (≈) beyond;
timeline buckets over 500 rows are estimated from the planner's histogram; a bulk preview
counts up to 100,000 rows, then estimates.""")
    return f"""## Web page and JSON API at {data['rows']:,} rows (`bench/bench_web.py`)

{run_line(command, data.get("revision"), data.get("finished_at"), data.get("machine"), load)}

{table}

{how}

{search_section(data.get("search"))}"""


def search_section(s: dict[str, Any] | None) -> str:
    """Argument search at size, without and with the opt-in index (bench/_web_search.py)."""
    if not s:
        return ""
    table = markdown_table(["mode", "search", "total ms", "first request ms", "requests",
                            "rows examined", "outcome"], search_lines(s), "llrrrrl")
    note = prose(f"""
The default search walks the table in ETA order, about a second per request, and the page asks
for the next slice by itself; the opt-in trigram index (`delayq tasks search-index create`)
took {s['index_build_s']:.0f} s to build on this table ({s['index_size']}). One publish
(`DelayedQueue.offer`, median of the timed ones): {s['publish_ms_without_index']:.2f} ms
without the index, {s['publish_ms_with_index']:.2f} ms with it.""")
    return f"""### Argument search, and what the opt-in index costs

{table}

{note}
"""


if __name__ == "__main__":
    main()
