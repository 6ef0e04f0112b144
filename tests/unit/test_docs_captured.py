"""The failures the pages show are captures of real runs (docs/_captured/, docs/_gen/captured.py).

* Every region ``<!-- captured: NAME ... -->`` of README.md and docs/ is exactly what
  docs/_gen/captured.py renders from docs/_captured/NAME.json.
* Every capture is shown somewhere and names the test that made it: that test exists and
  records it (``capture("NAME"``), so it is checked against what the code does on every run
  (tests/_captured.py).
* Every section of docs/troubleshooting.md shows at least one capture, and no failure there is
  quoted outside one.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from _captured import capture, normalise

ROOT = Path(__file__).resolve().parents[2]
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_captured", ROOT / "docs/_gen/captured.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
CAPTURES = sorted(p.stem for p in GEN.CAPTURED.glob("*.json"))


@pytest.mark.parametrize("page", GEN.PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_captured_region_is_its_rendering(page: Path) -> None:
    text = page.read_text()
    assert text == GEN.rendered(text), (
        f"{page.relative_to(ROOT)} differs from its captures: run python docs/_gen/captured.py")


def test_every_capture_is_shown_and_every_region_has_a_capture() -> None:
    shown = {name for page in GEN.PAGES for name in GEN.regions(page.read_text())}
    assert len(CAPTURES) >= 15, CAPTURES
    assert shown == set(CAPTURES), (
        f"captures no page shows: {sorted(set(CAPTURES) - shown)}; "
        f"regions without a capture: {sorted(shown - set(CAPTURES))}")


@pytest.mark.parametrize("name", CAPTURES)
def test_every_capture_names_the_test_that_records_it(name: str) -> None:
    test = json.loads((GEN.CAPTURED / f"{name}.json").read_text())["test"]
    path, _, function = test.partition("::")
    function = function.partition("[")[0]  # a parametrized test's id names one case
    source = (ROOT / path).read_text() if (ROOT / path).exists() else ""
    assert re.search(rf"^def {re.escape(function)}\(", source, re.MULTILINE), \
        f"{name}: the test {test} is gone"
    assert f'capture("{name}"' in source, f"{name}: {path} never records it"


def test_every_troubleshooting_section_shows_captured_failures_only() -> None:
    sections = re.split(r"^## ", TROUBLESHOOTING.read_text(), flags=re.MULTILINE)[1:]
    assert len(sections) >= 8
    for section in sections:
        heading = section.partition("\n")[0]
        assert GEN.regions(section), f"{heading!r}: no captured failure"
        outside = GEN.REGION.sub("", section)
        assert "```" not in outside, f"{heading!r}: a block that is not a capture"


def test_a_capture_that_changed_fails_and_says_how_to_regenerate(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    import _captured

    monkeypatch.setattr(_captured, "CAPTURED", tmp_path)
    monkeypatch.setattr(_captured, "WRITE", True)
    capture("x", "tests/t.py::test_x", command="delayq status", output="error: a", exit_status=4)
    monkeypatch.setattr(_captured, "WRITE", False)
    capture("x", "tests/t.py::test_x", command="delayq status", output="error: a", exit_status=4)
    with pytest.raises(AssertionError, match="DELAYQ_DOCS_CAPTURE=write"):
        capture("x", "tests/t.py::test_x", command="delayq status", output="error: a",
                exit_status=1)


def test_per_run_parts_are_normalised() -> None:
    line = ("[2026-11-27 09:55:08,179: ERROR/MainProcess] database 'delayq_t_0123456789ab' "
            "(cluster 7712785045367945329, up since 2026-11-27 09:45:07.12+00) pid 4242")
    assert normalise(line) == ("[<time>: ERROR/MainProcess] database 'app' "
                               "(cluster <id>, up since <time>) pid <pid>")
