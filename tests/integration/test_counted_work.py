"""Counted work per task held to its budget (issue 48 item 2): ``bench/counted.py`` counts, on a
throwaway PostgreSQL 15 cluster, the statements, round trips and WAL bytes per task of every
operation of the hot path, and this fails when one exceeds ``bench/budgets.json``: an ack
batch that sends one statement more is a failure whatever the timings say (the planted
mutation ``ack-batch-one-more-statement`` of tests/mutations/catalogue.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import counted  # noqa: E402


@pytest.mark.slow
def test_no_operation_does_more_work_per_task_than_its_budget() -> None:
    if not (counted.PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL 15 binaries in {counted.PG_BIN} (DELAYQ_PG_BIN)")
    budgets = json.loads(counted.BUDGETS.read_text())
    figures = counted.measure(budgets["tasks"])
    missing = set(budgets["operations"]) - set(figures)
    if not counted.PY312.exists():  # the django.tasks child needs Django 6 (Python 3.12)
        missing -= {op for op in missing if op.startswith("django")}
    assert not missing, f"operations not measured: {sorted(missing)}"
    over = counted.over_budget(figures, budgets)
    assert not over, (
        "more work per task than budgeted (bench/budgets.json):\n  " + "\n  ".join(over)
        + f"\nIf the change is meant, rewrite the budgets with `{budgets['update']}` and say "
        "why in the commit.")
