"""The command docs/getting-started-django.md gives for printing the ``delayq`` command's
database from ``DATABASES`` works as written: run against the test suite's Django project
(its settings module in place of ``proj.settings``), without ``manage.py`` and without a
database, it prints the libpq URL of ``DATABASES["default"]``, password included."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started-django.md"
#: The documented line: the settings module, then the Python code of ``python -c '...'``.
LINE = re.compile(r"DJANGO_SETTINGS_MODULE=(\S+) python -c '([^']+)'")


def test_the_documented_one_liner_prints_the_databases_url() -> None:
    found = LINE.search(PAGE.read_text())
    assert found, "the page no longer gives the command"
    module, code = found.groups()
    assert module == "proj.settings"
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="djproject.settings",
               DJANGO_DATABASE_URL="host=db port=6432 dbname=shop user=shop password=s3cr:t",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "django_project"),
                                           os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "postgresql://shop:s3cr%3At@db:6432/shop"
