"""Dramatiq's own tests (from the sdist of the installed version) against the delayq broker.

The files run in a pytest subprocess with our conftest and ``common`` module
(tests/acceptance/dramatiq_peer/). Every test must pass, except the documented differences
below (docs/contributing.md, *Dramatiq's own tests*), each asserted as such: a test listed
in ``STUB_ONLY`` must fail, with the error that names the difference (one that starts passing
fails this test too, so the list and the docs get updated); a test listed in ``REPLACED`` is
deselected and its adaptation (dramatiq_peer/peer_adapted.py) must pass. No test may be skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import dramatiq  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import pytest

from .dramatiq_peer.run_peer import default_cache, lay_out

#: Tests that read or write StubBroker's in-memory ``queues[name]`` (a ``queue.Queue``), which
#: a database broker does not have (``DelayqBroker.queues[name]`` is None): test -> the error.
STUB_ONLY = {
    "tests/test_actors.py::test_actors_can_be_sent_messages":
        "AttributeError: 'NoneType' object has no attribute 'get'",
    "tests/test_actors.py::test_worker_handles_non_numeric_eta_and_logs_warning":
        "AttributeError: 'NoneType' object has no attribute 'put'",
    "tests/test_actors.py::test_worker_handles_none_eta":
        "AttributeError: 'NoneType' object has no attribute 'put'",
}
#: Tests that assume a sent message is in the worker's memory at once: deselected, and run as
#: adapted in test_delayq_adapted.py (same name) with a bounded wait for the delivery. Their
#: outcome as written depends on the machine's load (expects 5 messages in the worker 1 ms
#: after the 5th send, while a consumer polls at most every 20 ms: it failed 11 of 12 runs
#: under load, passed the 12th), so neither "pass" nor "fail" can be asserted of it.
REPLACED = {
    "tests/test_worker.py::test_workers_process_messages_in_order":
        "tests/test_delayq_adapted.py::test_workers_process_messages_in_order",
}
#: Wall-clock assertions of Dramatiq's own (six 100 ms actors done within 0.5 s; 0.15-0.21 s
#: here on an idle machine): when a loaded machine makes one miss, it runs again on its own,
#: at most twice, and must pass there. Any other failure is not retried.
RETRIED = {
    "tests/test_composition.py::test_groups_execute_inner_groups[stub]",
    "tests/test_composition.py::test_groups_execute_inner_groups[redis]",
}
TOTAL = 115  # what the selected files hold, with the adapted tests in place of the replaced
RETRIES = 2


def run_peer(root: Path, env: dict[str, str], report: Path, *args: str
             ) -> dict[str, tuple[str, str]]:
    """Run pytest in ``root``; test id -> (outcome, message) from its JUnit report."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs",
         "--timeout", "60", "-o", "addopts=", "-o", "log_level=WARNING",
         f"--junitxml={report}", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=240)
    print(proc.stdout[-3000:])
    assert report.exists(), proc.stdout[-6000:] + proc.stderr[-3000:]
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = child.tag, child.get("message") or ""
        results[f"{module}::{case.get('name')}"] = (outcome, message)
    return results


@pytest.mark.slow
def test_dramatiq_peer_suite(database_url: str, tmp_path: Path) -> None:
    root = lay_out(tmp_path, default_cache())
    env = dict(os.environ, DELAYQ_PEER_DATABASE_URL=database_url,
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]),
                                           os.environ.get("PYTHONPATH", "")]))
    deselect = [arg for test in REPLACED for arg in ("--deselect", test)]
    results = run_peer(root, env, tmp_path / "peer.xml", "tests", *deselect)
    assert len(results) == TOTAL, sorted(results)
    assert not set(REPLACED) & set(results), "a replaced test ran"
    skipped = {t: m for t, (o, m) in results.items() if o == "skipped"}
    assert not skipped, f"skipped peer tests do not count as passes: {skipped}"
    for test, error in STUB_ONLY.items():
        outcome, message = results[test]
        assert outcome == "failure" and message.startswith(error), (
            f"{test}: a documented difference, expected to fail with {error!r}; got {outcome} "
            f"{message!r}: update STUB_ONLY and docs/contributing.md")
    for test in REPLACED.values():
        assert results[test][0] == "passed", (test, results[test])
    failed = {t: m for t, (o, m) in results.items() if o != "passed" and t not in STUB_ONLY}
    assert set(failed) <= RETRIED, failed
    for attempt in range(RETRIES):
        if not failed:
            break
        print(f"re-running alone ({attempt + 1}/{RETRIES}): {sorted(failed)}")
        again = run_peer(root, env, tmp_path / f"retry-{attempt}.xml", *sorted(failed))
        failed = {t: m for t, (o, m) in again.items() if o != "passed"}
    assert not failed, failed
