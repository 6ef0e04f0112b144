"""delayq's admin app as an operator uses it, in headless Chromium: the suite's Django project
served by ``manage.py runserver``, tasks that failed in a real ``manage.py delayq_worker``,
Dramatiq dead letters from the broker's nack, a periodic entry. Log in, find the failed tasks,
retry one from the list (it runs again on the worker and succeeds), look at a result's
tracebacks, the waiting tasks, the dead letters and the periodic entries.

Screenshots of each page are saved in ``DELAYQ_ADMIN_SCREENSHOTS`` (a directory) when it is
set, else in the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _dead_letters import dead_letters
from acceptance.conftest import wait_until
from click.testing import CliRunner
from conftest import create_database, drop_database
from playwright.sync_api import expect

from delayq_transport.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "django_project"
PASSWORD = "not-a-secret-1"


def env_for(url: str) -> dict[str, str]:
    return dict(os.environ, DJANGO_DATABASE_URL=url, DJANGO_SETTINGS_MODULE="djproject.settings",
                DJANGO_BEAT_APPS="1", DJANGO_SUPERUSER_PASSWORD=PASSWORD,
                PYTHONPATH=os.pathsep.join([str(ROOT), str(PROJECT),
                                            os.environ.get("PYTHONPATH", "")]))


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def project(template_db: str) -> Iterator[dict[str, str]]:
    """A database with delayq's tables and the project's (Django's admin among them), an
    admin user, and failures of each kind."""
    name = f"delayq_adm_{uuid.uuid4().hex[:10]}"
    url = create_database(name, template=template_db)
    env = env_for(url)
    try:
        manage(env, "migrate", "--verbosity", "0")
        manage(env, "createsuperuser", "--noinput", "--username", "ops",
               "--email", "ops@example.com")
        yield env
    finally:
        drop_database(name)


def enqueue(env: dict[str, str], code: str) -> list[str]:
    """Run ``code`` in ``manage.py shell``; the result ids it printed."""
    out = manage(env, "shell", "-c", "from shop import djtasks\n" + code)
    return re.findall(r"\b[0-9a-f]{8}-[0-9a-f-]{27}\b", out)


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query).fetchall()


@pytest.fixture
def served(project: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes], str]]:
    """Failed tasks made by a real worker, then the admin served; yields (base URL, the
    worker, the failing task's result id)."""
    url = project["DJANGO_DATABASE_URL"]
    ids = enqueue(project, "print(djtasks.flaky.enqueue('nightly-export', 3).id)\n"
                           "print(djtasks.fail.enqueue('invoice 77 has no customer').id)\n"
                           "for i in range(3): djtasks.add.enqueue(i, 1)\n"
                           "from datetime import timedelta\n"
                           "from django.utils import timezone\n"
                           "for i in range(4): djtasks.mail_add.using(run_after=timezone.now()"
                           " + timedelta(hours=i + 1)).enqueue(i, 2)")
    worker = subprocess.Popen([sys.executable, "manage.py", "delayq_worker", "--threads", "2"],
                              cwd=PROJECT, env=project, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    port = free_port()
    server = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}",
                               "--noreload", "--insecure"], cwd=PROJECT, env=project,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_until(lambda: len(rows(url, "SELECT 1 FROM delayq_task_results WHERE status "
                                         "IN ('SUCCESSFUL', 'FAILED')")) == 5, timeout=60,
                   message="the worker to finish the tasks")
        dead_letters(url, [("payments.charge", {"order": 1042}),
                           ("payments.charge", {"order": 1077})])
        added = CliRunner().invoke(main, ["-d", url, "beat", "add", "nightly-report",
                                          "reports.nightly", "--crontab", "30 2 * * *"])
        assert added.exit_code == 0, added.output

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, timeout=60, message="runserver to listen")
        yield f"http://127.0.0.1:{port}", worker, ids[0]
    finally:
        for proc in (server, worker):
            os.killpg(proc.pid, 15)
            proc.wait(30)


def test_an_operator_finds_and_retries_a_failed_task(served: Any, page: Any,
                                                     tmp_path: Path) -> None:
    base, _, failed_id = served
    shots = Path(os.environ.get("DELAYQ_ADMIN_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(base + "/admin/login/?next=/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#content")).to_contain_text("delayq")
    page.screenshot(path=str(shots / "admin-index.png"), full_page=True)

    page.goto(base + "/admin/delayq_admin/result/?status=FAILED")
    listed = page.locator("#delayq-list tr[data-ident]")
    expect(listed).to_have_count(2)
    page.screenshot(path=str(shots / "admin-results-failed.png"), full_page=True)
    page.locator(f'tr[data-ident="{failed_id}"] input.action-select').check()
    page.select_option("select[name=action]", "retry")
    page.click("#changelist-form .actions button")  # the confirmation is accepted
    expect(page.locator("ul.messagelist")).to_contain_text("Retry: 1 done")
    page.screenshot(path=str(shots / "admin-results-retried.png"), full_page=True)

    def succeeded() -> bool:
        page.goto(base + f"/admin/delayq_admin/result/{failed_id}/change/")
        return "SUCCESSFUL" in page.locator("#delayq-item").inner_text()

    wait_until(succeeded, timeout=60, message="the retried task to succeed on the worker")
    assert "attempt error 3" in page.content()
    page.screenshot(path=str(shots / "admin-result.png"), full_page=True)

    page.goto(base + "/admin/delayq_admin/task/")
    # The four deferred tasks (and the dead letters' rows: every kind of the table is listed,
    # as by `delayq tasks list`).
    expect(page.locator("#delayq-list tr[data-ident]", has_text="shop.djtasks.mail_add")
           ).to_have_count(4)
    page.screenshot(path=str(shots / "admin-tasks.png"), full_page=True)
    page.locator("#delayq-list tr[data-ident]", has_text="mail_add").locator("a").first.click()
    expect(page.locator("#delayq-item")).to_contain_text("shop.djtasks.mail_add")
    page.screenshot(path=str(shots / "admin-task.png"), full_page=True)

    page.goto(base + "/admin/delayq_admin/deadletter/")
    expect(page.locator("#delayq-list tr[data-ident]")).to_have_count(2)
    page.screenshot(path=str(shots / "admin-dead-letters.png"), full_page=True)
    page.goto(base + "/admin/delayq_admin/periodicentry/")
    expect(page.locator("#delayq-list")).to_contain_text("reports.nightly")
    page.screenshot(path=str(shots / "admin-periodic.png"), full_page=True)
