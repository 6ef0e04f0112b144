"""Tasks only the transport tests need, loaded into a worker with ``-I _kombu_tasks``."""

from __future__ import annotations

import os
import traceback

from celery import shared_task
from celery_app import record

LOOPS_PY = os.path.join("celery", "worker", "loops.py")


@shared_task(bind=True, name="kombu_tasks.loop_probe")
def loop_probe(self: object) -> list[str]:
    """Record which Celery consumer loop runs this task (solo pool: the loop's own stack).

    ``asynloop`` is Celery's event loop on the kombu hub; ``synloop`` is the sleep-and-poll
    fallback Celery picks for transports that cannot plug into the hub.
    """
    loops = [f.name for f in traceback.extract_stack() if f.filename.endswith(LOOPS_PY)]
    record(self.request.id, "loop-probe", loops)  # type: ignore[attr-defined]
    return loops
