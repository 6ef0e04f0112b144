"""Dramatiq's own tests (from the sdist of the installed version) against the delayq broker.

The files run in a pytest subprocess with our conftest and ``common`` module
(tests/acceptance/dramatiq_peer/). Every failure must be one listed here and explained in
docs/contributing.md (*Dramatiq's own tests*).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .dramatiq_peer.run_peer import default_cache, lay_out

pytest.importorskip("dramatiq")

#: Tests that read or write StubBroker's in-memory ``queues[name]`` (``Queue.get``/``put``).
STUB_ONLY = {
    "tests/test_actors.py::test_actors_can_be_sent_messages",
    "tests/test_actors.py::test_worker_handles_non_numeric_eta_and_logs_warning",
    "tests/test_actors.py::test_worker_handles_none_eta",
}
#: Wall-clock assertions that a loaded 2-core machine can miss with any broker
#: (a 1 s TimeLimit checked once a second against a 2 s sleep; six 100 ms actors in 0.5 s).
TIMING = {
    # Asserts the worker holds 5 messages 1 ms after the 5th send; a consumer polls at most
    # every 20 ms (POLL_GAP_S in delayq_transport/dramatiq/consumer.py): fails every run.
    "tests/test_worker.py::test_workers_process_messages_in_order",
    "tests/test_actors.py::test_actors_can_be_assigned_time_limits",
    "tests/test_actors.py::test_actor_messages_can_be_assigned_time_limits",
    "tests/test_composition.py::test_groups_execute_inner_groups[stub]",
    "tests/test_composition.py::test_groups_execute_inner_groups[redis]",
}
TOTAL = 115


@pytest.mark.slow
def test_dramatiq_peer_suite(database_url: str, tmp_path: Path) -> None:
    root = lay_out(tmp_path, default_cache())
    env = dict(os.environ, DELAYQ_PEER_DATABASE_URL=database_url,
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]),
                                           os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf",
         "--timeout", "60", "-o", "addopts=", "-o", "log_level=WARNING", "tests"],
        cwd=root, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout
    summary = out.strip().splitlines()[-1]
    failed = set(re.findall(r"^FAILED (\S+)", out, re.MULTILINE))
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", summary)) else 0
    print(f"dramatiq peer suite: {summary}")
    assert failed <= STUB_ONLY | TIMING, out[-6000:]
    assert STUB_ONLY <= failed, "a StubBroker-only test passed: update the list and the docs"
    assert passed + len(failed) == TOTAL, summary
    # Every TIMING test may miss on a loaded box, and they miss in pairs (both TimeLimit tests,
    # both result backends of the group test) on top of the one that fails every run: a
    # budget of 3 failed with 4 legitimate misses. Any other failure still fails above.
    assert passed >= TOTAL - len(STUB_ONLY) - len(TIMING), summary
