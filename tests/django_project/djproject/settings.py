"""Settings of the test suite's Django project, from the environment:

* ``DJANGO_DATABASE_URL``: the application's database, a libpq URL or keyword/value string
  (delayq's table lives there too: the broker URL is built from ``DATABASES``);
* ``DJANGO_DB_DRIVER``: ``psycopg`` (default) or ``psycopg2``: which driver Django's
  PostgreSQL backend runs on (it takes psycopg 3 whenever it can import it, and delayq needs
  psycopg 3, so psycopg2 is chosen by hiding psycopg 3 while the backend loads);
* ``DJANGO_DELAYQ_JOIN_ATOMIC``: ``1`` (default) or ``0``: ``DELAYQ_JOIN_ATOMIC``;
* ``DJANGO_CONN_MAX_AGE``: seconds (default 0, Django's: a connection per request);
* ``DELAYQ_TRANSPORT_OPTIONS``: JSON, Celery's ``broker_transport_options``;
* ``DJANGO_BROKER_URL``: another broker (Redis, RabbitMQ) instead of delayq in ``DATABASES``;
  ``DJANGO_TASK_QUEUE``: the default queue (``celery``);
* ``DJANGO_BEAT_APPS``: ``1`` adds what a team on django-celery-beat runs: ``django_celery_beat``,
  ``django_celery_results`` (the result backend ``django-db``) and the admin (with auth,
  sessions, messages and static files, at ``/admin/``) with delayq's admin app;
  ``DJANGO_BEAT_SCHEDULER``, ``DJANGO_BEAT_SOURCE``, ``DJANGO_BEAT_REFRESH``: Celery's
  ``beat_scheduler`` and delayq_beat's ``delayq_beat_source`` /
  ``delayq_beat_refresh_interval`` (seconds);
* ``DJANGO_TASKS_OPTIONS``: JSON, the ``OPTIONS`` of ``TASKS["default"]``, delayq's backend of
  Django's task framework (Django 6, or the django-tasks backport on older Django, then also in
  ``INSTALLED_APPS`` unless ``DJANGO_TASKS_APP=0``; without either ``TASKS`` is not set, unless
  ``DJANGO_TASKS_BACKEND=delayq``, which checks' tests of a missing framework set;
  tasks: shop/djtasks.py).
"""

from __future__ import annotations

import json
import os
import sys
from importlib.util import find_spec

import django
from psycopg.conninfo import conninfo_to_dict

from delayq_transport.django import broker_url

if os.environ.get("DJANGO_DB_DRIVER") == "psycopg2":
    _psycopg = sys.modules.pop("psycopg", None)
    sys.modules["psycopg"] = None  # type: ignore[assignment]  # import psycopg -> ImportError
    try:
        import django.db.backends.postgresql.base  # noqa: F401  (now on psycopg2)
    finally:
        sys.modules["psycopg"] = _psycopg  # type: ignore[assignment]

_db = conninfo_to_dict(os.environ.get("DJANGO_DATABASE_URL",
                                      "postgresql://postgres@127.0.0.1:5432/delayq_django"))

SECRET_KEY = "test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
ROOT_URLCONF = "djproject.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["shop", "delayq_transport.django"]
MIDDLEWARE: list[str] = []

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "postgres"),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        "CONN_MAX_AGE": int(os.environ.get("DJANGO_CONN_MAX_AGE", "0")),
    },
}

# delayq: tasks published inside transaction.atomic() on "default" join its transaction.
DELAYQ_JOIN_ATOMIC = os.environ.get("DJANGO_DELAYQ_JOIN_ATOMIC", "1") == "1"
DELAYQ_DATABASE = "default"

# Django's task framework on delayq (tests/djtasks), in the same table as Celery's tasks: Django
# 6's django.tasks, or on older Django the django-tasks backport, whose app registers the
# backends' system checks (delayq.W008 says so when it is missing).
# With neither (Django < 6 without the backport, as check-compat's Django 4.2 set runs the
# Celery tests) TASKS is not set: delayq.E006 would rightly refuse a backend with no framework.
TASK_FRAMEWORK = django.VERSION >= (6, 0) or find_spec("django_tasks") is not None
if (django.VERSION < (6, 0) and TASK_FRAMEWORK
        and os.environ.get("DJANGO_TASKS_APP", "1") == "1"):
    INSTALLED_APPS += ["django_tasks"]
if TASK_FRAMEWORK or os.environ.get("DJANGO_TASKS_BACKEND") == "delayq":
    TASKS = {
        "default": {
            "BACKEND": "delayq_transport.django.tasks.DelayqBackend",
            "QUEUES": ["default", "mail"],
            "OPTIONS": json.loads(os.environ.get("DJANGO_TASKS_OPTIONS", "{}")),
        },
    }

CELERY_BROKER_URL = os.environ.get("DJANGO_BROKER_URL") or broker_url(DATABASES["default"])
CELERY_BROKER_TRANSPORT_OPTIONS = json.loads(os.environ.get("DELAYQ_TRANSPORT_OPTIONS", "{}"))
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("DJANGO_TASK_QUEUE", "celery")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

if os.environ.get("DJANGO_BEAT_APPS") == "1":
    INSTALLED_APPS += ["django_celery_beat", "django_celery_results", "django.contrib.admin",
                       "django.contrib.auth", "django.contrib.contenttypes",
                       "django.contrib.sessions", "django.contrib.messages",
                       "django.contrib.staticfiles", "delayq_transport.django.admin"]
    STATIC_URL = "/static/"
    MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
                  "django.middleware.csrf.CsrfViewMiddleware",
                  "django.contrib.auth.middleware.AuthenticationMiddleware",
                  "django.contrib.messages.middleware.MessageMiddleware"]
    TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates",
                  "APP_DIRS": True, "OPTIONS": {"context_processors": [
                      "django.template.context_processors.request",
                      "django.contrib.auth.context_processors.auth",
                      "django.contrib.messages.context_processors.messages"]}}]
    TIME_ZONE = "UTC"
    CELERY_RESULT_BACKEND = "django-db"
    CELERY_RESULT_EXTENDED = True  # django-celery-results stores periodic_task_name
    CELERY_BEAT_SCHEDULER = os.environ.get("DJANGO_BEAT_SCHEDULER",
                                           "django_celery_beat.schedulers:DatabaseScheduler")
    CELERY_DELAYQ_BEAT_SOURCE = os.environ.get("DJANGO_BEAT_SOURCE") or None
    CELERY_DELAYQ_BEAT_REFRESH_INTERVAL = float(os.environ.get("DJANGO_BEAT_REFRESH", "60"))
