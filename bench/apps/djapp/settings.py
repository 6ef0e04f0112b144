"""Settings of every django.tasks system; the environment picks the backend.

``BENCH_DB_URL`` (the database), ``BENCH_DJANGO_BACKEND`` (``delayq``, ``db`` for
django-tasks-db, ``ox`` for django-ox, ``psql`` for django-task-psql), ``BENCH_OPTIONS``
(JSON: the backend's ``OPTIONS``), ``BENCH_DJANGO_POOL`` (``1``: Django's connection pool,
``OPTIONS={"pool": True}``). Everything else is Django's default (``CONN_MAX_AGE`` 0: a
connection per task where a worker closes old connections around each).
"""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

_url = urlsplit(os.environ.get("BENCH_DB_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
SECRET_KEY = "bench"
USE_TZ = True
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": _url.path.lstrip("/"),
    "USER": _url.username or "postgres", "PASSWORD": _url.password or "",
    "HOST": _url.hostname or "127.0.0.1", "PORT": str(_url.port or 5432),
    "OPTIONS": {"pool": True} if os.environ.get("BENCH_DJANGO_POOL") == "1" else {}}}
#: backend -> (its installed app, its TASKS BACKEND)
BACKENDS = {
    "delayq": ("delayq_transport.django", "delayq_transport.django.tasks.DelayqBackend"),
    "db": ("django_tasks_db", "django_tasks_db.DatabaseBackend"),
    "ox": ("django_ox", "django_ox.backend.OxBackend"),
    "psql": ("django_task_psql", "django_task_psql.backend.PostgresBackend"),
}
_app, _backend = BACKENDS[os.environ.get("BENCH_DJANGO_BACKEND", "delayq")]
#: ``djapp`` itself is an app: django-task-psql's worker imports each app's ``tasks`` module.
INSTALLED_APPS = ["django.contrib.contenttypes", "djapp", _app]
TASKS = {"default": {"BACKEND": _backend, "QUEUES": ["default"],
                     "OPTIONS": json.loads(os.environ.get("BENCH_OPTIONS", "{}"))}}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "root": {"level": "WARNING", "handlers": []}}
