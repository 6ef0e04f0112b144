"""The periodic actors of one release (``DEPLOY_RELEASE``: ``old`` or ``new``) for the deploy
test (test_deploy_dramatiq.py, schedule in tests/_deploy_ticks.py): ``dramatiq dramatiq_app
_dramatiq_deploy`` workers import it after the app, whose ``every_second`` is the entry both
releases share (``tick``). Each run is recorded as ``<label>:<occurrence ms>``."""

from __future__ import annotations

import os
from typing import Any

import dramatiq
import dramatiq_app
from dramatiq.middleware import CurrentMessage

from delayq_transport.dramatiq.periodic import periodic

RELEASE = os.environ.get("DEPLOY_RELEASE", "old")


@dramatiq.actor(queue_name="deploy")
def deploy_tick(label: str) -> None:
    msg = CurrentMessage.get_current_message()
    dramatiq_app.record("deploy_tick", f"{label}:{msg.message_timestamp if msg else None}")


def every_second(entry: str, label: str, **options: Any) -> None:
    periodic(every=1, misfire="run_all", name=f"dramatiq:deploy-{entry}", args=(label,),
             **options)(deploy_tick)


if RELEASE == "old":
    every_second("changed", "changed-v1")
    every_second("removed", "removed")
    every_second("flaky", "flaky")
else:
    every_second("changed", "changed-v2")
    every_second("added", "added")
    every_second("flaky", "flaky", broker_priority="urgent")  # not a priority: invalid
