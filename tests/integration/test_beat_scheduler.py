"""The Celery Scheduler class and the `delayq beat` CLI against real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from _tables import row_cells
from celery import Celery
from celery.schedules import crontab
from click.testing import CliRunner

from delayq_beat import Scheduler
from delayq_transport.cli import main
from delayq_transport.core.queue import from_ms
from delayq_transport.formats import celery as message


@pytest.fixture
def app(database_url: str) -> Iterator[Celery]:
    app = Celery("beat_t", broker=database_url.replace("postgresql://", "delayq+postgresql://"),
                 set_as_current=False)
    app.conf.timezone = "America/New_York"
    app.conf.delayq_beat_refresh_interval = 30
    app.conf.delayq_beat_horizon = 300
    app.conf.task_routes = {"beat_t.routed": {"queue": "routed_q"}}

    @app.task(name="beat_t.tick", shared=False)
    def tick(n: int = 0) -> int:
        return n

    yield app


def keys_by_kind(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute(
            'SELECT "pKind", count(*) FROM delayed_queue GROUP BY 1').fetchall())


def test_scheduler_installs_beat_schedule_with_routing(app: Celery, database_url: str) -> None:
    app.conf.beat_schedule = {
        "every_10s": {"task": "beat_t.tick", "schedule": 10.0, "args": (1,)},
        "routed": {"task": "beat_t.routed", "schedule": crontab(minute="*/1")},
        "unknown": {"task": "nope.missing", "schedule": 10.0},
        "bad_schedule": {"task": "beat_t.tick", "schedule": "often"},
    }
    app.conf.delayq_beat_check_tasks = True
    sched = Scheduler(app)
    try:
        delay = sched.tick()
        report = sched.last_report
        assert 0 < delay <= 30
        # beat_t.routed is not registered either: the registry holds user tasks, so all refused
        assert set(report.errors) == {"unknown", "bad_schedule", "routed"}
        assert "unknown task" in report.errors["unknown"]
        # 300 s of 10 s ticks, less the first one when it falls within CronService's min_lead
        # (1 s): an occurrence that close to now is never (re)created, by design.
        assert report.installed["every_10s"] in (29, 30)
        installed = report.installed["every_10s"]
        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                """SELECT "scheduledAt" FROM delayed_queue WHERE "pKey" LIKE 'every\\_10s/%'"""
            ).fetchall()
        assert len(rows) == installed and all(at % 10_000 == 0 for (at,) in rows)
        assert sched.info.strip().startswith(". delayq")
    finally:
        sched.close()


def test_router_resolves_task_routes(app: Celery, database_url: str) -> None:
    app.conf.delayq_beat_check_tasks = False
    app.conf.beat_schedule = {
        "routed": {"task": "beat_t.routed", "schedule": 60.0},
        "prio": {"task": "beat_t.tick", "schedule": 60.0, "options": {"priority": 9}},
    }
    sched = Scheduler(app)
    try:
        sched.refresh()
    finally:
        sched.close()
    kinds = keys_by_kind(database_url)
    # plus celery.backend_cleanup (3 daily occurrences), added by Celery's own default entries
    prio = message.kind_for("celery", 9)
    assert set(kinds) == {"routed_q", prio, "celery"} and kinds["celery"] == 3
    # Same 60 s schedule: 5 occurrences, or 4 when the first is due within min_lead (1 s).
    assert kinds["routed_q"] == kinds[prio] and kinds["routed_q"] in (4, 5)


def test_cli_add_list_disable_enable_remove_and_status(database_url: str) -> None:
    run = CliRunner().invoke
    env = {"DELAYQ_DATABASE_URL": database_url, "COLUMNS": "200"}
    ok = run(main, ["beat", "add", "reports/daily_%", "t.report", "--crontab", "30 2 * * *",
                    "--args", "[1]", "--misfire", "skip", "--grace", "5"], env=env)
    assert ok.exit_code == 0, ok.output
    bad = run(main, ["beat", "add", "x", "t.x", "--crontab", "99 * * * *"], env=env)
    assert bad.exit_code == 1 and "Invalid end range" in bad.output.replace("\n", " ")
    both = run(main, ["beat", "add", "x", "t.x", "--every", "5", "--crontab", "* * * * *"], env=env)
    assert both.exit_code == 2
    listed = run(main, ["beat", "list"], env=env)
    assert "reports/daily_%" in listed.output and "crontab 30 2 * * *" in listed.output
    assert run(main, ["beat", "disable", "reports/daily_%"], env=env).exit_code == 0
    assert " no " in run(main, ["beat", "list"], env=env).output
    assert run(main, ["beat", "enable", "nope"], env=env).exit_code == 1
    assert run(main, ["beat", "enable", "reports/daily_%"], env=env).exit_code == 0
    status = run(main, ["status"], env=env)
    assert status.exit_code == 0 and "reports/daily_%" in status.output
    # A fresh ``delayq status`` process loads the beat plugin (lazily) because entries exist.
    fresh = _fresh_status(database_url)
    assert "reports/daily_%" in fresh and "celery loaded: True" in fresh
    assert run(main, ["beat", "remove", "reports/daily_%"], env=env).exit_code == 0
    assert run(main, ["beat", "remove", "reports/daily_%"], env=env).exit_code == 1


def _fresh_status(database_url: str) -> str:
    """``delayq status`` in a new interpreter; reports whether Celery got imported."""
    code = ("import sys\nfrom delayq_transport.cli import main\n"
            "try:\n    main(['-d', sys.argv[1], 'status'])\nexcept SystemExit:\n    pass\n"
            "print('celery loaded:', 'celery' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, database_url], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_status_without_beat_entries_does_not_import_celery(database_url: str) -> None:
    """Start-up time: the plugins (Celery, Starlette, pyspark) load only when needed."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute('DELETE FROM "delayq_schedule_entries"')
        conn.execute('DELETE FROM "delayq_schedule_installed"')
    assert "celery loaded: False" in _fresh_status(database_url)


def test_cli_list_shows_next_occurrences_with_install_time(app: Celery, database_url: str) -> None:
    app.conf.beat_schedule = {"every_10s": {"task": "beat_t.tick", "schedule": 10.0}}
    sched = Scheduler(app)
    try:
        sched.refresh()
    finally:
        sched.close()
    out = CliRunner().invoke(main, ["beat", "list", "--next", "2"],
                             env={"DELAYQ_DATABASE_URL": database_url, "COLUMNS": "200"}).output
    with psycopg.connect(database_url) as conn:
        soonest = conn.execute(
            """SELECT "pKey", "scheduledAtInitially", "createdAt" FROM delayed_queue
               WHERE "pKey" LIKE 'every\\_10s/%' ORDER BY "scheduledAt" LIMIT 2""").fetchall()
    assert len(soonest) == 2
    utc = "%m-%d %H:%M:%S"
    expected = [f"{from_ms(at).strftime(utc)} ({from_ms(created).strftime('%H:%M:%S')})"
                for _, at, created in soonest]
    cells = row_cells(out, "every_10s")
    assert cells["next 2 (installed)"] == ["; ".join(expected)], out  # not a terminal: one line
    assert cells["hash"] == [soonest[0][0].split("/")[1][:8]], out
    assert cells["queue"] == ["celery"] and cells["origin"] == ["config"], out

