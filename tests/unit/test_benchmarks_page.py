"""Measured figures live in docs/benchmarks.md (and README's table rendered with it), written
from bench/results/*.json by the benchmarks' own writers with one rounding rule.

* ``python bench/render_docs.py --check``: the page's generated sections (the targets table
  included) and README's table are what the writers make of the stored results;
* every figure of the page is inside a generated section: prose outside the markers states no
  ratio or rate;
* no other page states a ratio or a rate: it links to the page instead.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/benchmarks.md"
#: A measured figure: a ratio (``1.03×``) or a rate (``1,355 tasks/s``), a CPU time per task.
FIGURE = re.compile(r"\d+(?:\.\d+)?[×x](?=[\s,;).]|$)|\d[\d,]* ?(?:tasks|msgs|rows|inserts)/s"
                    r"|\d[\d,.]* ?µs", re.MULTILINE)
GENERATED = re.compile(r"<!-- (\w+):start -->.*?<!-- \1:end -->", re.DOTALL)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)


def test_the_page_and_readme_are_what_the_results_render() -> None:
    done = subprocess.run([sys.executable, "render_docs.py", "--check"], cwd=ROOT / "bench",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        "docs/benchmarks.md or README.md differs from bench/results: run python "
        f"bench/render_docs.py\n{done.stdout}{done.stderr}")


def test_the_page_states_figures_only_in_generated_sections() -> None:
    outside = FENCE.sub("", GENERATED.sub("", PAGE.read_text()))
    assert FIGURE.findall(outside) == []


@pytest.mark.parametrize("page", sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_other_pages_link_to_the_figures_instead_of_stating_them(page: Path) -> None:
    if page == PAGE:
        return
    text = FENCE.sub("", GENERATED.sub("", page.read_text()))
    found = [m.group(0) for m in FIGURE.finditer(text)]
    assert found == [], f"{page.relative_to(ROOT)} states figures {found}: link to " \
                        "docs/benchmarks.md instead"


def test_the_figure_pattern_finds_ratios_and_rates_only() -> None:
    text = "1.03× and 0.96x, 1,355 tasks/s, 370 µs; not 2x2, v1.2, 5 ms, 10,000 rows"
    assert FIGURE.findall(text) == ["1.03×", "0.96x", "1,355 tasks/s", "370 µs"]
