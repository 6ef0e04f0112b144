"""Which task framework delayq's backend runs on (delayq_transport/django/_framework.py), and
what differs between Django 6's ``django.tasks`` and the django-tasks backport (Django 5.2):
the other tests of this directory run unchanged on both (scripts/test runs them twice); these
state, per framework, what each has."""

from __future__ import annotations

import subprocess
import sys

import django
import pytest

from delayq_transport.django import _framework
from delayq_transport.django._framework import BACKPORT

from .conftest import PROJECT, project_env


def check(url: str, **extra: str) -> str:
    """``manage.py check``'s report (warnings go to stderr; they do not fail it)."""
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=PROJECT,
                          env=project_env(url, **extra), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_the_framework_is_djangos_own_from_django_6_else_the_backport() -> None:
    assert (_framework.SOURCE, BACKPORT) == (("django.tasks", False) if django.VERSION >= (6, 0)
                                             else ("django_tasks", True))
    # The framework's own classes under Django 6's names: the backport's InvalidTaskError is
    # what its Task raises, so it is what `except InvalidTask` must catch.
    source = _framework.SOURCE
    assert _framework.InvalidTask.__module__ == f"{source}.exceptions"
    assert _framework.InvalidTask.__name__ == ("InvalidTaskError" if BACKPORT else "InvalidTask")
    assert _framework.Task.__module__ == f"{source}.base"
    assert type(_framework.task_backends).__module__ == source


def test_manage_py_check_runs_the_backends_checks(dj_url: str) -> None:
    report = check(dj_url, DJANGO_TASKS_OPTIONS='{"TABLE": "dj_missing"}')
    assert "delayq.W002" in report and "delayq.W008" not in report


def test_without_the_backports_app_delayq_says_its_checks_do_not_run(dj_url: str) -> None:
    """The backport registers the backends' checks from its app ``django_tasks`` only; Django 6
    when ``django.tasks`` is first imported (there is no app to add), which delayq's app does
    as it loads: the project's apps import no task module then."""
    report = check(dj_url, DJANGO_TASKS_OPTIONS='{"TABLE": "dj_missing"}', DJANGO_TASKS_APP="0")
    if BACKPORT:
        assert "delayq.W008" in report and "add 'django_tasks' to INSTALLED_APPS" in report
        assert "delayq.W002" not in report
    else:
        assert "delayq.W002" in report and "delayq.W008" not in report


MISSING = """
import sys
sys.modules["django_tasks"] = None  # as if the backport were not installed
import django
django.setup()
from django.core import checks
from delayq_transport.django import FrameworkMissing, tasks
try:
    tasks.DelayqBackend
except FrameworkMissing as exc:
    print("names:", exc)
print("checks:", *[m.id for m in checks.run_checks() if (m.id or "").startswith("delayq")])
"""


@pytest.mark.skipif(not BACKPORT, reason="Django 6 always has django.tasks: only an older "
                    "Django can lack a framework (delayq.E006)")
def test_without_a_framework_the_names_and_the_check_say_what_to_install(dj_url: str) -> None:
    env = {**project_env(dj_url), "DJANGO_TASKS_BACKEND": "delayq"}  # TASKS set all the same
    done = subprocess.run([sys.executable, "-c", MISSING], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    names, found = done.stdout.strip().splitlines()[-2:]
    assert names.startswith("names: delayq_transport.django.tasks.DelayqBackend: ")
    assert "Django >= 6" in names and "`pip install django-tasks`" in names
    assert found == "checks: delayq.E006"
