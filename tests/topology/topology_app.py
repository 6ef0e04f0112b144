"""The Celery app of the topology tests' worker and beat processes: the acceptance app (its
``mark`` task records every execution in ``DELAYQ_RESULTS_URL``) plus a beat schedule from the
environment. Broker URL and transport options come from the environment as there."""

from __future__ import annotations

import json
import os

from celery_app import app  # noqa: F401  (tests/acceptance/celery_app.py)

app.conf.beat_schedule = json.loads(os.environ.get("BEAT_SCHEDULE", "{}"))
app.conf.delayq_beat_refresh_interval = float(os.environ.get("BEAT_REFRESH", "2"))
app.conf.delayq_beat_horizon = float(os.environ.get("BEAT_HORIZON", "30"))
