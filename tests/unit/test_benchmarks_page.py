"""Measured figures live in docs/benchmarks.md and README's table, rendered by bench/render.py
from the records of bench/results/*.json through the templates of bench/templates:

* the committed page and README's table are what the committed records render, so neither
  can drift from the results (``python bench/run.py render`` rewrites them);
* a record of a checkout with uncommitted changes is refused, or marked when asked;
* the templates state no figure of their own: every one comes from a placeholder;
* which publish mode of another broker a page pairs with delayq's comes from the records'
  ``durability`` (``render.peer``), and the templates' prose names no broker mode;
* no other page states a ratio or a rate: it links to the page instead.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/benchmarks.md"
TEMPLATES = ROOT / "bench/templates"
sys.path.insert(0, str(ROOT / "bench"))

import records  # noqa: E402
import render  # noqa: E402
import systems  # noqa: E402

#: A measured figure: a ratio (``1.03×``) or a rate (``1,355 tasks/s``), a CPU time per task.
FIGURE = re.compile(r"\d+(?:\.\d+)?[×x](?=[\s,;).]|$)|\d[\d,]* ?(?:tasks|msgs|rows|inserts)/s"
                    r"|\d[\d,.]* ?µs", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
#: Jinja2's expressions, statements and comments, and a target's bound (``≥ 1.2×``).
PLACEHOLDER = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}|[≥≤] ?\d+(?:\.\d+)?×", re.DOTALL)


def test_the_page_and_readme_are_what_the_results_render() -> None:
    page, table = render.render()
    assert PAGE.read_text() == page, \
        "docs/benchmarks.md differs from bench/results: run python bench/run.py render"
    readme = (ROOT / "README.md").read_text()
    assert render.readme_with(table, readme) == readme, \
        "README.md's table differs from bench/results: run python bench/run.py render"


def _record(revision: str) -> dict[str, object]:
    return {"system": "celery-delayq", "scenario": "e2e", "revision": revision, "round": 1,
            "figures": {"tasks_per_s": 1000.0}, "command": "python bench/run.py run",
            "date": "2026-12-01T00:00:00+00:00"}


def test_a_record_of_uncommitted_changes_is_refused_or_marked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "e2e.json").write_text(json.dumps([_record("abc1234+dirty")]))
    monkeypatch.setattr(records, "RESULTS_DIR", tmp_path)
    with pytest.raises(render.DirtyRecord, match="abc1234"):
        render.render()
    page, _ = render.render(allow_dirty=True)
    assert "abc1234 (with uncommitted changes)" in page


def test_a_figure_shows_the_median_of_its_rounds_with_their_range() -> None:
    cell = render.Cell("celery-delayq", [
        {**_record("abc1234"), "round": i, "figures": {"tasks_per_s": v, "p99_ms": v / 100}}
        for i, v in enumerate((1144.0, 1437.0, 1355.0), 1)])
    assert cell.fig("tasks_per_s") == "1,355 (1,144–1,437)"
    assert cell.fig("p99_ms") == "13.6 (11.4–14.4)"
    assert render.ratio(cell, cell, "tasks_per_s") == "1.00×"


@pytest.mark.parametrize("template", sorted(TEMPLATES.glob("*.j2")), ids=lambda p: p.name)
def test_the_templates_state_no_figure_of_their_own(template: Path) -> None:
    prose = PLACEHOLDER.sub("", FENCE.sub("", template.read_text()))
    assert FIGURE.findall(prose) == []


@pytest.mark.parametrize("page", sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_other_pages_link_to_the_figures_instead_of_stating_them(page: Path) -> None:
    if page == PAGE:
        return
    text = FENCE.sub("", page.read_text())
    if page.name == "README.md":
        text = render.README_BLOCK.sub("", text)
    found = [m.group(0) for m in FIGURE.finditer(text)]
    assert found == [], f"{page.relative_to(ROOT)} states figures {found}: link to " \
                        "docs/benchmarks.md instead"


def test_the_figure_pattern_finds_ratios_and_rates_only() -> None:
    text = "1.03× and 0.96x, 1,355 tasks/s, 370 µs; not 2x2, v1.2, 5 ms, 10,000 rows"
    assert FIGURE.findall(text) == ["1.03×", "0.96x", "1,355 tasks/s", "370 µs"]


def _durable(system: str, durability: str) -> dict[str, object]:
    known = systems.BY_NAME[system].settings()
    return {**_record("abc1234"), "system": system, "settings": {**known,
                                                                 "durability": durability}}


def test_the_pairs_come_from_the_records_durability() -> None:
    found = [_durable("celery-delayq", systems.COMMIT), _durable("celery-delayq-durable",
             systems.FLUSH), _durable("celery-rabbitmq", systems.SOCKET),
             _durable("celery-rabbitmq-confirm", systems.CONFIRM)]
    e = render.Results("e2e", found)
    assert render.peer(e, e("celery-delayq-durable"), "rabbitmq").system == \
        "celery-rabbitmq-confirm"
    assert render.peer(e, e("celery-delayq"), "rabbitmq").system == "celery-rabbitmq"
    # Records that say the other way round pair the other way round.
    found[2]["settings"]["durability"], found[3]["settings"]["durability"] = \
        systems.CONFIRM, systems.SOCKET
    assert render.peer(e, e("celery-delayq-durable"), "rabbitmq").system == "celery-rabbitmq"
    found[0]["settings"]["durability"] = "once it felt like it"
    with pytest.raises(ValueError, match="CRASH_SAFE"):
        render.peer(e, e("celery-delayq"), "rabbitmq")


@pytest.mark.parametrize("template", sorted(TEMPLATES.glob("*.j2")), ids=lambda p: p.name)
def test_the_templates_pair_no_publish_modes_by_hand(template: Path) -> None:
    prose = PLACEHOLDER.sub("", FENCE.sub("", template.read_text()))
    assert re.findall(r"confirm\w*|durable_\w+ against|guarantee of", prose) == []
