"""examples/dramatiq_app.py runs as documented, and ``delayq beat list`` shows its actors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dramatiq  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.slow
def test_example_sends_and_its_periodic_actors_are_listed(database_url: str) -> None:
    env = dict(os.environ, DELAYQ_DATABASE_URL=database_url,
               PYTHONPATH=os.pathsep.join([str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")]))
    sent = subprocess.run([sys.executable, "dramatiq_app.py"], cwd=EXAMPLES, env=env,
                          capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    assert "sent; queue default: {'messages': 3, 'dead_letters': 0}" in sent.stdout
    refresh = ("import dramatiq_app as a\n"
               "from delayq_transport.dramatiq.periodic import PeriodicScheduler\n"
               "r = PeriodicScheduler(a.broker).refresh(); assert not r.errors, r\n"
               "a.broker.close()\n")
    subprocess.run([sys.executable, "-c", refresh], cwd=EXAMPLES, env=env, check=True,
                   timeout=60)
    listed = subprocess.run([sys.executable, "-m", "delayq_transport", "beat", "list"],
                            env=dict(env, COLUMNS="200"), capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "Dramatiq periodic actors" in listed.stdout
    assert "dramatiq:morning_report" in listed.stdout and "dramatiq:heartbeat" in listed.stdout
