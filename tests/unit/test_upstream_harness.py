"""tests/upstream/run.py's own logic (the tool itself needs a fetched copy of Django's and
django-tasks-db's tests, so neither the suite nor CI runs it): which verdict a test gets, and
that every test of ours its reasons name exists, so the list of differences cannot point at a
test renamed or removed since."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("upstream_run",
                                                  ROOT / "tests" / "upstream" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_test_takes_its_own_verdict_then_its_class_then_its_modules_else_it_applies(
        ) -> None:
    run = harness()
    run.VERDICTS["m"] = {"C.t": (run.DIFFERS, "own"), "C.*": (run.NA, "class"),
                         "*": (run.NA, "module")}
    assert run.verdict_for("m", "C", "t") == (run.DIFFERS, "own")
    assert run.verdict_for("m", "C", "u") == (run.NA, "class")
    assert run.verdict_for("m", "D", "t") == (run.NA, "module")
    assert run.verdict_for("other", "C", "t") == (run.APPLIES, "")


def test_every_verdict_has_a_reason_and_every_test_of_ours_it_names_exists() -> None:
    run = harness()
    named: list[tuple[str, str]] = []
    for module, table in run.VERDICTS.items():
        for key, (verdict, reason) in table.items():
            assert verdict in (run.APPLIES, run.DIFFERS, run.NA), (module, key)
            assert reason, (module, key)
            named += re.findall(r"(test_\w+\.py)::(test_\w+)", reason)
            if verdict == run.DIFFERS:  # a difference is asserted by a test of ours
                assert "Ours: " in reason, (module, key)
    assert named
    for file, function in named:
        tree = ast.parse((ROOT / "tests" / "djtasks" / file).read_text())
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert function in defined, f"{file}::{function} is named by run.py but not defined"
