"""The project's Celery app, configured from Django's settings (``CELERY_`` names)."""

from __future__ import annotations

import os

from celery import Celery

import delayq_transport  # noqa: F401  (registers the delayq+ scheme with kombu)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproject.settings")

app = Celery("djproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
