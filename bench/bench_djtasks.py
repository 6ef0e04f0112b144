"""Django's task framework: delayq's backend against django-tasks-db on the same database.

    DJANGO_TASKS_DB_PATH=/dir/with/django_tasks_db python3.12 bench/bench_djtasks.py

Needs Django 6 (Python 3.12) and django-tasks-db importable (a ``pip install --target`` dir
given by ``DJANGO_TASKS_DB_PATH``, or installed). The suite's Django project
(tests/django_project) runs both: its ``TASKS`` names delayq's backend, or django-tasks-db's
with ``DJANGO_TASKS_BACKEND=db``. Each round, for each system in turn (interleaved), on a
fresh database:

* **throughput**: a worker runs while one producer process enqueues ``--count`` no-op tasks
  (``shop.djtasks.add``) as fast as it can; end to end = tasks / (last finish - first
  enqueue);
* **lateness**: ``--deferred`` tasks with ``run_after`` spread over ``--spread`` seconds;
  lateness = the task's start - its ``run_after`` (p50, p99).

Workers: ``manage.py db_worker`` (its defaults: one task at a time, a poll each second when
idle) and ``manage.py delayq_worker --threads 1`` (the same concurrency) and ``--threads 4``.
Results: bench/results/djtasks.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_ADMIN_URL,
    REPO_ROOT,
    command_line,
    fmt_rate,
    fresh_database,
    git_revision,
    machine_info,
    markdown_table,
    percentile,
    prose,
    run_line,
    times,
    write_results,
)

PROJECT = REPO_ROOT / "tests" / "django_project"
#: (name, backend, worker command line after manage.py)
SYSTEMS = [
    ("django-tasks-db", "db", ["db_worker"]),
    ("delayq, 1 thread", "delayq", ["delayq_worker", "--threads", "1"]),
    ("delayq, 4 threads", "delayq", ["delayq_worker", "--threads", "4"]),
]
#: Per system: (finished count, first start, last finish ms) and the lateness of deferred ones.
QUERIES = {
    "delayq": (
        "SELECT count(*), max(\"finishedAt\") FROM delayq_task_results "
        "WHERE status = 'SUCCESSFUL'",
        "SELECT \"startedAt\" - (\"task\"->>'run_after_us')::bigint / 1000 "
        "FROM delayq_task_results WHERE status = 'SUCCESSFUL' "
        "AND \"task\"->>'run_after_us' IS NOT NULL"),
    "db": (
        "SELECT count(*), (extract(epoch FROM max(finished_at)) * 1000)::bigint "
        "FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'",
        "SELECT extract(epoch FROM started_at - run_after) * 1000 "
        "FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL' "
        "AND run_after < '9000-01-01'"),
}


def env_for(url: str, backend: str) -> dict[str, str]:
    env = dict(os.environ, DJANGO_DATABASE_URL=url, DJANGO_SETTINGS_MODULE="djproject.settings",
               DJANGO_TASKS_BACKEND=backend)
    paths = [str(REPO_ROOT), str(PROJECT), os.environ.get("DJANGO_TASKS_DB_PATH", ""),
             env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise click.ClickException(f"manage.py {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def wait_for(what: str, predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise click.ClickException(f"timed out after {timeout:.0f} s waiting for {what}")


def one_run(admin_url: str, name: str, backend: str, worker: list[str], count: int,
            deferred: int, spread: float) -> dict[str, Any]:
    with fresh_database(admin_url, "delayq_bench_dj") as url:
        env = env_for(url, backend)
        manage(env, "migrate", "--no-input")
        if backend == "delayq":
            from delayq_transport import Database, migrate

            with Database(url, max_size=1) as db:
                migrate(db, "delayed_queue")
        finished_sql, lateness_sql = QUERIES[backend]

        def finished() -> tuple[int, int | None]:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(finished_sql).fetchone()
            assert row is not None
            return int(row[0]), row[1]

        log = open(Path("/tmp") / f"bench_djtasks_{os.getpid()}.log", "ab")
        proc = subprocess.Popen([sys.executable, "manage.py", *worker], cwd=PROJECT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            time.sleep(3)  # the worker's start-up (imports, migrations check): not measured
            started = json.loads(manage(env, "bench_enqueue", "--count", str(count))
                                 .strip().splitlines()[-1])
            wait_for(f"{count} tasks ({name})", lambda: finished()[0] >= count, 600)
            _, last_ms = finished()
            throughput = count / ((int(last_ms) - started["started_ms"]) / 1000)
            manage(env, "bench_enqueue", "--count", str(deferred), "--spread", str(spread))
            wait_for(f"{deferred} deferred tasks ({name})",
                     lambda: finished()[0] >= count + deferred, spread + 120)
            with psycopg.connect(url, autocommit=True) as conn:
                late = [float(r[0]) for r in conn.execute(lateness_sql).fetchall()]
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
        return {"system": name, "tasks": count, "tasks_per_s": round(throughput, 1),
                "deferred": len(late), "lateness_p50_ms": round(percentile(late, 50) or 0, 1),
                "lateness_p99_ms": round(percentile(late, 99) or 0, 1)}


def section(data: dict[str, Any]) -> str:
    """The "Django's task framework" section of docs/benchmarks.md from a results file:
    medians of the rounds per system, against django-tasks-db."""
    by_system: dict[str, list[dict[str, Any]]] = {}
    for run in data["runs"]:
        by_system.setdefault(run["system"], []).append(run)

    def median(runs: list[dict[str, Any]], key: str) -> float:
        values = sorted(r[key] for r in runs)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    base = median(by_system["django-tasks-db"], "tasks_per_s")
    rows = [[name, fmt_rate(median(runs, "tasks_per_s")),
             times(median(runs, "tasks_per_s") / base),
             f"{median(runs, 'lateness_p50_ms'):,.0f}", f"{median(runs, 'lateness_p99_ms'):,.0f}"]
            for name, runs in by_system.items()]
    first = data["runs"][0]
    how = prose(f"""
The suite's Django project (tests/django_project) on Django 6 with each backend in turn, on a
fresh database per run, {len(data['runs']) // len(by_system)} interleaved rounds, medians.
End to end: a worker runs while one producer process enqueues {first['tasks']:,} no-op tasks
outside any transaction; tasks over the time from the first enqueue to the last finish (the
producer's own rate bounds it). Lateness: {first['deferred']:,} tasks deferred with
`run_after` spread over {data.get('spread', 10):g} s, each task's start minus its run_after.
django-tasks-db 0.13 runs `manage.py db_worker` at its defaults (one task at a time, a poll
each second when idle: its lateness); delayq runs `manage.py delayq_worker` with one thread
(the same concurrency) and with four.""")
    return f"""## Django's task framework

{run_line(data.get("command", "python bench/bench_djtasks.py"), data.get("revision"),
          data.get("finished_at"), data.get("machine"))}

{markdown_table(["backend and worker", "tasks/s end to end", "vs django-tasks-db",
                 "lateness p50 ms", "lateness p99 ms"], rows, "lrrrr")}

{how}
"""


@click.command()
@click.option("--admin-url", default=DEFAULT_ADMIN_URL, show_default=True)
@click.option("--rounds", default=2, show_default=True)
@click.option("--count", default=1000, show_default=True, help="Tasks of the throughput run")
@click.option("--deferred", default=200, show_default=True, help="Deferred tasks")
@click.option("--spread", default=10.0, show_default=True, help="Seconds they spread over")
def main(admin_url: str, rounds: int, count: int, deferred: int, spread: float) -> None:
    runs = []
    for round_ in range(rounds):
        for name, backend, worker in SYSTEMS:
            result = one_run(admin_url, name, backend, worker, count, deferred, spread)
            result["round"] = round_ + 1
            click.echo(json.dumps(result))
            runs.append(result)
    path = write_results("djtasks", {"command": command_line(), "revision": git_revision(),
                                     "spread": spread, "machine": machine_info(admin_url),
                                     "runs": runs})
    click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()
