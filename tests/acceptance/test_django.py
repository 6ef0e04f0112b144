"""Django without code changes (issues 34 and 36): the test suite's Django project
(tests/django_project: an ``Order`` model, its migration, a view placing an order and publishing
its receipt task inside ``transaction.atomic()``), its Celery app configured from Django's
settings with the broker URL built from ``DATABASES``, and a real ``celery worker``.

With ``DELAYQ_JOIN_ATOMIC``, on psycopg 3 and on psycopg2: several producer processes call the
view through Django's test client, a seeded half of the orders declined (rolled back) after the
task was published; exactly the committed orders get a receipt, once each, and every receipt
found its order although the view kept working for a while after publishing. The control,
with the setting off, shows what the test would catch: receipts of rolled-back orders, and
receipts that ran before their order committed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .conftest import CeleryProcess, wait_until

PROJECT = Path(__file__).parent.parent / "django_project"
ROOT = PROJECT.parent.parent


@pytest.fixture
def django_env(database_url: str) -> dict[str, str]:
    """The project's environment for this test's database, migrated."""
    env = dict(os.environ)
    env.update(
        DJANGO_DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="djproject.settings",
        DELAYQ_TRANSPORT_OPTIONS=json.dumps({"acquire_timeout": 10, "polling_interval": 2}),
        PYTHONPATH=os.pathsep.join([str(ROOT), str(PROJECT), env.get("PYTHONPATH", "")]),
    )
    manage(env, "migrate", "--no-input")
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 240) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def django_worker(django_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """``celery -A djproject worker`` started with the test's environment and options."""
    started: list[CeleryProcess] = []

    def start(**extra: str) -> CeleryProcess:
        proc = CeleryProcess(["-A", "djproject", "worker", "-P", "solo", "--loglevel=INFO",
                              "-n", f"dj-{os.getpid()}-{len(started)}@%h"],
                             dict(django_env, **extra), tmp_path / f"worker-{len(started)}.log")
        started.append(proc)
        proc.wait_for_log("ready.")
        return proc

    yield start
    for proc in started:
        proc.stop()


def receipts(url: str) -> list[tuple[int, bool]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [(int(o), bool(f)) for o, f in conn.execute(
            "SELECT order_id, found FROM shop_receipt ORDER BY id").fetchall()]


def place_orders(env: dict[str, str], producers: int, count: int, linger: float) -> list[int]:
    """Run ``manage.py place_orders`` in ``producers`` processes at once; the committed ids."""
    procs = [subprocess.Popen(
        [sys.executable, "manage.py", "place_orders", "--count", str(count), "--seed", str(i),
         "--linger", str(linger)], cwd=PROJECT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for i in range(producers)]
    committed: list[int] = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        committed += json.loads(out.strip().splitlines()[-1])
    manage(env, "place_orders", "--count", "0", "--sentinel")
    return committed


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_tasks_published_in_atomic_run_exactly_when_their_order_committed(
        driver: str, django_env: dict[str, str], django_worker: Any, database_url: str) -> None:
    env = dict(django_env, DJANGO_DB_DRIVER=driver)
    used = manage(env, "shell", "-c", "from django.db import connection; "
                  "connection.ensure_connection(); print(type(connection.connection).__module__)")
    assert used.split()[-1].split(".")[0] == driver  # Django's backend runs on that driver
    django_worker(DJANGO_DB_DRIVER=driver)
    committed = place_orders(env, producers=3, count=16, linger=0.2)
    assert 8 < len(committed) < 40  # the seeds decline about half of 48
    wait_until(lambda: (0, False) in receipts(database_url), timeout=120,
               message="the sentinel receipt, published after every order")
    ran = [r for r in receipts(database_url) if r[0] != 0]
    assert sorted(order for order, _ in ran) == sorted(committed)  # each once, no other
    assert all(found for _, found in ran), ran  # never before its order committed


def test_without_the_setting_tasks_escape_the_transaction(
        django_env: dict[str, str], django_worker: Any, database_url: str) -> None:
    """The control: what the test above would catch if the setting did nothing."""
    env = dict(django_env, DJANGO_DELAYQ_JOIN_ATOMIC="0")
    django_worker(DJANGO_DELAYQ_JOIN_ATOMIC="0")
    committed = place_orders(env, producers=1, count=8, linger=0.5)
    wait_until(lambda: (0, False) in receipts(database_url), timeout=120)
    ran = [r for r in receipts(database_url) if r[0] != 0]
    assert len(ran) == 8 > len(committed)  # rolled-back orders got receipts too
    assert not all(found for _, found in ran)  # and tasks ran before their commit
