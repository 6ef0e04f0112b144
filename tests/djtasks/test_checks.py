"""delayq's system checks (delayq_transport/django/checks.py) through real ``manage.py``
processes of the test project: a refused OPTIONS value or name is a check message with its
E-code and exit status 1, not a traceback; a ``DATABASE`` that is not in ``DATABASES`` is
``delayq.E001`` in ``check``, and the worker, which runs no checks, refuses to start with
``ImproperlyConfigured`` (what a gunicorn process gets from its first enqueue: test_options.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import PROJECT, project_env

OPTIONS_HINT = "HINT: see docs/reference/django-tasks-options.md for each option and its values"


def manage(url: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT,
                          env=project_env(url, **extra), capture_output=True, text=True,
                          timeout=120)


def options(**values: object) -> str:
    return json.dumps(values)


def test_refused_options_are_check_errors_with_their_code(dj_url: str) -> None:
    done = manage(dj_url, "check", DJANGO_TASKS_OPTIONS=options(LEASE=-1, RETRY=2,
                                                                POOL_SIZE="8"))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[:2] == ["SystemCheckError: System check identified some issues:", ""]
    errors = [line for line in lines if "(delayq.E007)" in line]
    assert errors == [
        "?: (delayq.E007) TASKS['default'] OPTIONS LEASE = -1: expected a number of seconds > 0",
        "?: (delayq.E007) TASKS['default'] OPTIONS POOL_SIZE = '8': expected an int >= 1",
        "?: (delayq.E007) TASKS['default'] OPTIONS: unknown option 'RETRY' (did you mean "
        "'RETRIES'?); the options are DATABASE, TABLE, JOIN_ATOMIC, RETRIES, BACKOFF, "
        "MAX_BACKOFF, LEASE, RESULT_RETENTION, DEAD_LETTER_RETENTION, SCHEMA_WAIT, "
        "POLLING_INTERVAL, POOL_SIZE, PERIODIC, PERIODIC_SOURCE, PERIODIC_REFRESH"]
    assert done.stderr.count(OPTIONS_HINT) == 3
    assert lines[-1] == "System check identified 3 issues (0 silenced)."


def test_a_database_alias_not_in_databases_is_e001(dj_url: str) -> None:
    done = manage(dj_url, "check", DJANGO_TASKS_OPTIONS=options(DATABASE="nope"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "?: (delayq.E001) TASKS['default']: OPTIONS DATABASE = 'nope' is not in DATABASES " \
           "(have: default)" in done.stderr.splitlines()


@pytest.mark.parametrize(("given", "message"), [
    (options(DATABASE="nope"), "TASKS['default']: OPTIONS DATABASE = 'nope' is not in "
     "DATABASES (have: default); name the DATABASES alias whose database holds delayq's "
     "table"),
    (options(LEASE="60"), "TASKS['default'] OPTIONS LEASE = '60': expected a number of "
     "seconds > 0"),
])
def test_the_worker_refuses_to_start_with_improperly_configured(
        dj_url: str, given: str, message: str) -> None:
    done = manage(dj_url, "delayq_worker", DJANGO_TASKS_OPTIONS=given)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"django.core.exceptions.ImproperlyConfigured: {message}")
    assert " ready" not in done.stdout
