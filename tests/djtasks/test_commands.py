"""delayq's ``manage.py`` commands as a team runs them, real processes against real databases,
exit statuses asserted: ``delayq_migrate`` (the tables from ``DATABASES``, ``--check`` as a
deploy's gate), ``delayq_health`` (0 healthy, 1 a check failed or the database is down, 2 a
usage error), ``delayq_prune`` (results past a retention)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _captured import capture
from conftest import create_database, drop_database

from delayq_transport import DelayedQueue
from delayq_transport.core import LostAttempt, TaskResults

from .conftest import PROJECT, project_env, sql

HERE = "tests/djtasks/test_commands.py"

#: An attempt begun by hand, as a worker begins one.
STARTED: dict[str, Any] = {
    "alive_ms": 10_000,
    "lost": LostAttempt("x.TaskInterrupted", "attempt %s (worker %s) was lost"),
}

pytestmark = pytest.mark.slow


def manage(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT,
                          env=project_env(url, **env), capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def empty_url() -> Iterator[str]:
    """A database without delayq's tables (nor Django's: the commands need none)."""
    name = f"delayq_cmd_{uuid.uuid4().hex[:10]}"
    yield create_database(name)
    drop_database(name)


def test_delayq_migrate_makes_the_tables_the_settings_name(empty_url: str) -> None:
    check = manage(empty_url, "delayq_migrate", "--check")
    assert check.returncode == 1 and "delayed_queue in DATABASES['default']: missing [1, " \
        in check.stdout and "run manage.py delayq_migrate" in check.stderr
    done = manage(empty_url, "delayq_migrate")
    assert done.returncode == 0, done.stderr
    assert "delayed_queue in DATABASES['default']: applied [1, 2" in done.stdout
    again = manage(empty_url, "delayq_migrate")
    assert again.returncode == 0 and "already current" in again.stdout
    assert manage(empty_url, "delayq_migrate", "--check").returncode == 0
    # The backend's TABLE option, and a Celery project's --database/--table.
    other = manage(empty_url, "delayq_migrate",
                   DJANGO_TASKS_OPTIONS=json.dumps({"TABLE": "shop_queue"}))
    assert other.returncode == 0 and "shop_queue in DATABASES['default']: applied" \
        in other.stdout
    celery = manage(empty_url, "delayq_migrate", "--database", "default", "--table", "celeryq")
    assert celery.returncode == 0 and "celeryq" in celery.stdout
    assert {r[0] for r in sql(empty_url, "SELECT DISTINCT \"tableName\" FROM "
                                         "delayq_migrations")} == \
        {"delayed_queue", "shop_queue", "celeryq"}
    # Wrong names are one line and exit 1; a usage error is 2.
    bad = manage(empty_url, "delayq_migrate", "--backend", "nope")
    assert bad.returncode == 1 and "TASKS['nope'] is not a delayq backend" in bad.stderr
    bad = manage(empty_url, "delayq_migrate", "--database", "elsewhere")
    assert bad.returncode == 1 and "no DATABASES entry 'elsewhere'" in bad.stderr
    bad = manage(empty_url, "delayq_migrate", "--table", "bad-name!", "--database", "default")
    assert bad.returncode == 1 and "table" in bad.stderr
    assert manage(empty_url, "delayq_migrate", "--nope").returncode == 2


def test_delayq_health_exit_status_says_what_a_monitor_needs(empty_url: str) -> None:
    missing = manage(empty_url, "delayq_health")
    assert missing.returncode == 1
    assert "FAIL tables" in missing.stdout and "manage.py delayq_migrate" in missing.stdout
    assert manage(empty_url, "delayq_migrate").returncode == 0
    healthy = manage(empty_url, "delayq_health")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "ok   backlog: 0 due" in healthy.stdout and "ok   database" in healthy.stdout
    # A due task nobody takes: the backlog check fails once it waited longer than allowed.
    with DelayedQueue(empty_url, kind="django:default:0", ensure_schema=False) as queue:
        queue.offer("stuck", b'{"task": "shop.djtasks.add"}')
        queue.with_kind("celery").offer("other-queue", b"{}")
        now = queue.now()
        sql(empty_url, 'UPDATE delayed_queue SET "scheduledAt" = "scheduledAt" - 20000, '
                       '"scheduledAtInitially" = "scheduledAtInitially" - 20000')
        results = TaskResults(queue, "django:")
        at = int(now.timestamp() * 1000)
        for key in ("f1", "f2"):
            results.start(key, "{}", None, "w", at, **STARTED)
            results.finish(key, "FAILED", at, finished=True,
                           error={"exception_class_path": "x.E", "traceback": "E"})
    late = manage(empty_url, "delayq_health", "--max-due-age", "10", "--json")
    assert late.returncode == 1 and "backlog" in late.stderr
    report = json.loads(late.stdout)
    assert report["ok"] is False
    backlog = next(c for c in report["checks"] if c["name"] == "backlog")
    assert not backlog["ok"] and backlog["figures"]["due"] == 1  # the backend's queue only
    assert backlog["figures"]["oldest_due_age_s"] >= 20
    assert manage(empty_url, "delayq_health", "--max-due-age", "600").returncode == 0
    failing = manage(empty_url, "delayq_health", "--max-due-age", "600", "--max-failed", "1")
    assert failing.returncode == 1 and "FAIL failures: 2+ failed in the last 3600 s" \
        in failing.stdout
    capture("health-failures", f"{HERE}::test_delayq_health_exit_status_says_what_a_monitor_needs",
            command="python manage.py delayq_health --max-due-age 600 --max-failed 1",
            output=re.sub(r"waiting [\d.]+ s", "waiting 25.9 s",  # the test's own wait
                          failing.stdout + failing.stderr), exit_status=failing.returncode,
            replace={empty_url.rsplit("/", 1)[-1]: "shop"})
    assert manage(empty_url, "delayq_health", "--max-due-age", "600", "--max-failed",
                  "2").returncode == 0
    # The database down is unhealthy, said in one line; bad arguments are a usage error.
    down = manage("postgresql://postgres@127.0.0.1:1/nothing", "delayq_health")
    assert down.returncode == 1 and "FAIL database: unreachable" in down.stdout
    assert manage(empty_url, "delayq_health", "--max-due-age", "-1").returncode == 2


def test_delayq_prune_deletes_results_past_the_retention(empty_url: str) -> None:
    assert manage(empty_url, "delayq_migrate").returncode == 0
    with DelayedQueue(empty_url, kind="django:default:0", ensure_schema=False) as queue:
        results = TaskResults(queue, "django:")
        now = int(queue.now().timestamp() * 1000)
        for key, age_h in (("week-old", 24 * 8), ("day-old", 25), ("fresh", 0)):
            results.start(key, "{}", None, "w", now - age_h * 3_600_000, **STARTED)
            results.finish(key, "SUCCESSFUL", now - age_h * 3_600_000, finished=True,
                           return_json="1")
        results.start("running", "{}", None, "w", now - 24 * 9 * 3_600_000, **STARTED)

    def kept() -> set[str]:
        return {r[0] for r in sql(empty_url, "SELECT id FROM delayq_task_results")}

    default = manage(empty_url, "delayq_prune")  # RESULT_RETENTION: 7 days
    assert default.returncode == 0 and "deleted 1 result(s) of delayed_queue" in default.stdout
    assert kept() == {"day-old", "fresh", "running"}
    day = manage(empty_url, "delayq_prune", "--older-than", "1d")
    assert day.returncode == 0 and "deleted 1 result(s)" in day.stdout
    assert kept() == {"fresh", "running"}  # a running task's result is never pruned
    forever = manage(empty_url, "delayq_prune",
                     DJANGO_TASKS_OPTIONS=json.dumps({"RESULT_RETENTION": None}))
    assert forever.returncode == 1 and "give --older-than" in forever.stderr
    bad = manage(empty_url, "delayq_prune", "--older-than", "soon")
    assert bad.returncode == 1 and "--older-than" in bad.stderr
