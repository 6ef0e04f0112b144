"""A rolling deploy and its rollback, as the process tests of every front end run it
(tests/acceptance/test_deploy_beat.py, test_deploy_dramatiq.py, tests/djtasks/test_deploy.py),
and what their ticks must show (docs/how-to/beat.md#two-configurations-at-once).

Two releases of one schedule, every entry every second (``run_all``, so a slow worker runs
every tick late rather than none):

==========  ================  =============================================================
entry       old release       new release
==========  ================  =============================================================
tick        yes               the same: every occurrence runs once, through the deploy
changed     args ``v1``       args ``v2``: each second runs once, as v1 or as v2
removed     yes               no: none runs while the new release is in force
added       no                yes: runs only while the new release is in force
flaky       yes               invalid: its installed rows are kept and run
==========  ================  =============================================================

The old release runs alone, then the new one joins (its configuration is in force once both
schedulers saw it), then the new one goes (the rollback: the old configuration is in force
again). The runs are the labels above (``changed`` as ``changed-v1``/``changed-v2``) with the
occurrence's epoch ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

PERIOD_MS = 1000
Runs = dict[str, list[int]]
LABELS = ("tick", "changed-v1", "changed-v2", "removed", "added", "flaky")


def by_label(runs: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """label -> the occurrence times that ran, in order (a time twice if it ran twice)."""
    out: dict[str, list[int]] = {label: [] for label in LABELS}
    for label, at_ms in runs:
        out[label].append(at_ms)
    return {label: sorted(times) for label, times in out.items()}


def counts(runs: Mapping[str, list[int]]) -> dict[str, int]:
    return {label: len(times) for label, times in runs.items()}


def _contiguous(name: str, times: list[int]) -> None:
    assert times, f"{name}: no run"
    assert len(times) == len(set(times)), f"{name} ran twice: " + str(
        sorted({t for t in times if times.count(t) > 1}))
    expected = list(range(times[0], times[-1] + PERIOD_MS, PERIOD_MS))
    missing = sorted(set(expected) - set(times))
    assert not missing, f"{name}: ticks lost at {missing} (ran {times})"


def assert_deploy_and_rollback(runs: Mapping[str, list[int]], *, at_least: int = 3) -> None:
    """No tick lost, none doubled; the new configuration held between its first and last
    ``changed-v2`` run, the old one before and after; the invalid entry's rows ran."""
    v1, v2 = runs["changed-v1"], runs["changed-v2"]
    _contiguous("tick", runs["tick"])
    _contiguous("flaky (invalid in the new release)", runs["flaky"])
    _contiguous("changed-v2", v2)
    _contiguous("changed (v1 or v2)", sorted(v1 + v2))
    start, end = v2[0], v2[-1]
    assert len(v2) >= at_least, f"the new release held {len(v2)} ticks only"
    before, after = [t for t in v1 if t < start], [t for t in v1 if t > end]
    assert len(before) >= at_least and len(after) >= at_least, (before, v2, after)
    held = [t for t in runs["removed"] if start <= t <= end]
    assert not held, f"removed ran while the new release was in force: {held}"
    assert [t for t in runs["removed"] if t < start] and [t for t in runs["removed"] if t > end]
    assert runs["added"], "added never ran"
    assert len(runs["added"]) == len(set(runs["added"])), "added ran twice"
    outside = [t for t in runs["added"] if not start - PERIOD_MS <= t <= end + PERIOD_MS]
    assert not outside, f"added ran while the old release was in force: {outside}"
    flaky = runs["flaky"]
    assert flaky[0] < start and flaky[-1] > end, "flaky's rows did not run through the deploy"


class Deploy:
    """The phases every front end's test goes through, each a bounded wait on the runs
    (``runs``: the test's reading of them, by label)."""

    def __init__(self, runs: Callable[[], Runs], timeout: float = 60.0) -> None:
        self.runs = runs
        self.timeout = timeout

    def wait(self, done: Callable[[Runs], bool], what: str) -> Runs:
        deadline = time.monotonic() + self.timeout
        while not done(found := self.runs()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {counts(found)}"
            time.sleep(0.05)
        return found

    def old_release_alone(self) -> None:
        self.wait(lambda r: len(r["tick"]) >= 3 and len(r["changed-v1"]) >= 3,
                  "the old release's ticks")

    def new_release_in_force(self) -> None:
        self.wait(lambda r: len(r["changed-v2"]) >= 5, "the new release in force")

    def rolled_back(self, what: str) -> Runs:
        """After the new release's scheduler went: the old one in force again, for a few
        ticks; then every run is checked (and the counts printed)."""
        stopped = max(self.runs()["changed-v2"])
        found = self.wait(lambda r: len([t for t in r["changed-v1"] if t > stopped]) >= 4
                          and any(t > stopped for t in r["removed"]),
                          "the old release in force again")
        print(f"{what}, runs per label:", counts(found))
        assert_deploy_and_rollback(found)
        return found
