"""A small Django project on delayq, for the test suite: a shop whose orders get a receipt task.

Configured from the environment (djproject/settings.py), so each test points it at a database
of its own. Import the Celery app here, as Celery's Django guide does, so ``@shared_task``s
bind to it.
"""

from __future__ import annotations

from .celery import app as celery_app

__all__ = ["celery_app"]
