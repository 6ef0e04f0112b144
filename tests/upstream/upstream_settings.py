"""Settings the upstream tests run under (tests/upstream/run.py): delayq's backend of
``django.tasks`` on the fresh database run.py made (``DELAYQ_UPSTREAM_DATABASE_URL``).

django-tasks-db is installed as an app when it is importable: its tests' module imports its
models and admin at import (not used by the tests that apply to delayq; run.py migrates them,
so the flush of Django's TransactionTestCase finds their tables)."""

from __future__ import annotations

import os
from importlib.util import find_spec

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["DELAYQ_UPSTREAM_DATABASE_URL"])

SECRET_KEY = "upstream-tests-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["delayq_transport.django"]
if find_spec("django_tasks_db") is not None:  # its admin module needs the admin's apps
    INSTALLED_APPS += ["django.contrib.admin", "django.contrib.auth",
                       "django.contrib.contenttypes", "django.contrib.sessions",
                       "django.contrib.messages", "django_tasks_db"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "postgres"),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    },
}

TASKS = {"default": {"BACKEND": "delayq_transport.django.tasks.DelayqBackend"}}
