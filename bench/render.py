"""The renderer: docs/benchmarks.md and README's comparison table (between
``<!-- readme:start -->`` and ``<!-- readme:end -->``) are Jinja2 templates
(``bench/templates/``) filled from the records of ``bench/results/*.json``.

The templates hold the prose; this module gives them the figures: ``r.e2e("celery-delayq")``
is the cell of a system in a results file (every round of it), ``cell.fig("tasks_per_s")``
its median with the rounds' range, ``ratio(a, b, name)`` a ratio of medians, ``about(r.e2e)``
the command, revision, date and machine the records name. One rounding rule for every figure:
rates, µs and MB with no decimal, ms with one, seconds with two, ratios with two and ``×``,
counts per task with four significant digits, other figures as whole numbers when they are,
else with two decimals.
A record of a revision with uncommitted changes is refused (``allow_dirty``: marked instead).
"""

from __future__ import annotations

import math
import re
import statistics
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import records
import systems
from jinja2 import Environment, FileSystemLoader, StrictUndefined

TEMPLATES = records.BENCH_DIR / "templates"
PAGE = records.REPO_ROOT / "docs" / "benchmarks.md"
README = records.REPO_ROOT / "README.md"
README_BLOCK = re.compile(r"(<!-- readme:start -->\n).*?(\n<!-- readme:end -->)", re.DOTALL)
MISSING = "—"


class DirtyRecord(ValueError):
    """A record measured on a checkout with uncommitted changes: no page may show it."""


def fmt(name: str, value: float | None) -> str:
    """A figure as every page shows it, by its name's unit."""
    if value is None:
        return MISSING
    if name == "ratio" or name.endswith("_ratio"):
        return f"{value:.2f}×"
    if name.endswith("_ms"):
        return f"{value:,.1f}"
    if name.endswith("_s") and not name.endswith("per_s"):
        return f"{value:,.2f}"
    if name.endswith("_per_task"):  # counted work (bench/counted.py): 0.01333 statements
        if value >= 1000 or value == 0:
            return f"{value:,.0f}"
        digits = 3 - math.floor(math.log10(abs(value)))  # four significant, never 8e-05
        return f"{value:.{digits}f}".rstrip("0").rstrip(".")
    if name.endswith(("_per_s", "_us", "_mb")) or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.2f}"


@dataclass
class Cell:
    """Every round of one system in one scenario."""

    system: str
    runs: list[records.Record]

    @property
    def ok(self) -> list[records.Record]:
        return [r for r in self.runs if not r.get("error")]

    @property
    def label(self) -> str:
        known = systems.BY_NAME.get(self.system)
        return str(self.settings.get("label") or (known.label if known else self.system))

    def setting(self, name: str) -> str:
        """What the records say about their system (``config``, ``durability``): the
        systems table's row only when there is no record."""
        known = systems.BY_NAME.get(self.system)
        fallback = known.settings().get(name, "") if known else ""
        return str(self.settings.get(name, fallback))

    @property
    def crash_safe(self) -> bool:
        """Whether a publish that returned survives a crash of the broker, by the records'
        ``durability`` (what the pages pair systems by)."""
        text = self.setting("durability")
        if text not in systems.CRASH_SAFE:
            raise ValueError(f"{self.system}: durability {text!r} is not in "
                             "bench/systems.py's CRASH_SAFE")
        return systems.CRASH_SAFE[text]

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.runs[0].get("settings") or {}) if self.runs else {}

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.runs[0].get("params") or {}) if self.runs else {}

    @property
    def errors(self) -> list[str]:
        return [str(r["error"]) for r in self.runs if r.get("error")]

    def values(self, name: str) -> list[float]:
        return [float(r["figures"][name]) for r in self.ok if name in r["figures"]]

    def median(self, name: str) -> float | None:
        values = self.values(name)
        return statistics.median(values) if values else None

    def fig(self, name: str) -> str:
        """The median, with the rounds' min–max when they differ as shown; a run that
        failed every round says so."""
        values = self.values(name)
        if not values:
            return "failed" if self.errors and not self.ok else MISSING
        text, low, high = (fmt(name, v) for v in (statistics.median(values), min(values),
                                                  max(values)))
        text = text if low == high else f"{text} ({low}–{high})"
        if name == "tasks_per_s" and self.values("stopped"):
            text += f" (stopped at {self.params.get('limit_s')} s)"
        return text

    def rounds(self) -> int:
        return len(self.ok)


class Results:
    """The records of one results file, by system (and, for a file holding several
    scenarios, by scenario)."""

    def __init__(self, name: str, found: list[records.Record]) -> None:
        self.name, self.records = name, found

    def __call__(self, system: str, scenario: str | None = None) -> Cell:
        return Cell(system, [r for r in self.records if r["system"] == system
                             and (scenario is None or r["scenario"] == scenario)])

    def __bool__(self) -> bool:
        return bool(self.records)

    def systems(self) -> list[str]:
        """In the systems table's order (others, e.g. count48's, in their own)."""
        order = {s.name: i for i, s in enumerate(systems.SYSTEMS)}
        seen = list(dict.fromkeys(r["system"] for r in self.records))
        return sorted(seen, key=lambda s: order.get(s, len(order) + seen.index(s)))

    def revisions(self) -> list[str]:
        return list(dict.fromkeys(r["revision"] for r in self.records))

    def at(self, system: str, scenario: str, revision: str) -> Cell:
        """One system's rounds at one revision (an A/B run holds two)."""
        return Cell(system, [r for r in self(system, scenario).runs
                             if r["revision"] == revision])

    def scenarios(self) -> list[str]:
        return list(dict.fromkeys(r["scenario"] for r in self.records))

    def figure_names(self) -> list[str]:
        return list(dict.fromkeys(k for r in self.records for k in r.get("figures", {})))


def peer(table: Results, cell: Cell, broker: str) -> Cell:
    """The system of ``broker`` in ``table``, of ``cell``'s framework, whose returned publish a
    crash of the broker treats as ``cell``'s (:attr:`Cell.crash_safe`): the pair a page
    compares, chosen by the records' ``durability``, not by the template."""
    framework = cell.setting("framework")
    found = [c for c in (table(n) for n in table.systems()) if c.setting("broker") == broker
             and c.setting("framework") == framework and c.setting("durability")
             and c.crash_safe == cell.crash_safe]
    return found[0] if found else Cell(f"{broker} (no system alike)", [])


def guarantee(cell: Cell) -> str:
    """What a crash of the broker does to ``cell``'s returned publish, in words."""
    return "no crash of the broker loses it" if cell.crash_safe else \
        "a crash of the broker can lose it"


def ratio(a: Cell, b: Cell, name: str, name_b: str | None = None) -> str:
    """Median over median, as every page shows a ratio."""
    x, y = a.median(name), b.median(name_b or name)
    return MISSING if x is None or not y else fmt("ratio", x / y)


def ratio_value(a: Cell, b: Cell, name: str, name_b: str | None = None) -> float | None:
    x, y = a.median(name), b.median(name_b or name)
    return None if x is None or not y else round(x / y, 2)


def revisions(*found: Cell) -> str:
    """The revisions of these cells' records, as a table cell shows them."""
    return ", ".join(sorted({revision_text(r["revision"]) for c in found for r in c.runs})) \
        or MISSING


def revision_text(revision: str) -> str:
    if revision.endswith("+dirty"):
        return f"{revision.removesuffix('+dirty')} (with uncommitted changes)"
    return revision


def about(*tables: Results, only: Iterable[str] | None = None) -> str:
    """The sentence a section opens with: command, revision(s), date(s), machine, rounds (of
    the records of ``only`` these systems, if given)."""
    keep = None if only is None else set(only)
    found = [r for t in tables for r in t.records if keep is None or r["system"] in keep]
    if not found:
        return "Not measured yet."
    commands = sorted({f"`{r['command']}`" for r in found})
    revisions = sorted({revision_text(r["revision"]) for r in found})
    days = sorted({r["date"][:10] for r in found})
    machines = sorted({r["machine"] for r in found if r.get("machine")})
    rounds = sorted({max(r["round"] for r in found if r["system"] == s)
                     for s in {r["system"] for r in found}})
    text = (f"{' and '.join(commands)}, revision{'s' if len(revisions) > 1 else ''} "
            f"{', '.join(revisions)}, {' to '.join(days[::max(len(days) - 1, 1)])}; "
            f"{'; '.join(machines) or 'machine not recorded'}; ")
    text += ("one round" if rounds == [1] else
             f"medians of {'–'.join(map(str, rounds[::max(len(rounds) - 1, 1)]))} interleaved "
             "rounds, their range in brackets")
    if any("--quick" in r["command"] for r in found):
        text += ". A smoke run (`--quick`): sizes too small and rounds too few to rely on"
    return text + "."


def holds(value: float | None, op: str, target: float) -> str:
    """A target judged on the figure as shown."""
    if value is None:
        return "not measured"
    ok = value >= target if op == ">=" else value <= target
    return "yes" if ok else "**no**"


def load(allow_dirty: bool = False) -> dict[str, Results]:
    out: dict[str, Results] = {}
    for name in records.names():
        found = records.load(name)
        dirty = [r for r in found if records.is_dirty(r)]
        if dirty and not allow_dirty:
            raise DirtyRecord(f"bench/results/{name}.json holds {len(dirty)} record(s) of "
                              f"{dirty[0]['revision']}, a checkout with uncommitted changes: "
                              "commit, re-run, then render")
        out[name] = Results(name, found)
    return out


class _All:
    """Every results file by name (``r.e2e``, ``r["e2e-threads"]``); a missing one is empty
    (a page renders before its first run)."""

    def __init__(self, found: dict[str, Results]) -> None:
        self._found = found

    def __getitem__(self, name: str) -> Results:
        return self._found.get(name) or Results(name, [])

    def __getattr__(self, name: str) -> Results:
        return self[name]


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.globals.update(ratio=ratio, ratio_value=ratio_value, about=about, holds=holds,
                       peer=peer, guarantee=guarantee,
                       fmt=fmt, cells=cells, revisions=revisions, systems=systems.BY_NAME,
                       MISSING=MISSING)
    return env


def render(allow_dirty: bool = False) -> tuple[str, str]:
    """The page and README's table, from the stored records."""
    env, r = _environment(), _All(load(allow_dirty))
    page = env.get_template("benchmarks.j2").render(r=r)
    table = _tidy(env.get_template("readme.j2").render(r=r)).strip("\n")
    return _tidy(page), table


#: A block the refill leaves as it is: a table, list, heading, code, comment or image.
KEEP = re.compile(r"^(\||- |#|    |<!--|!\[|\\\*)")


def _tidy(text: str) -> str:
    """Prose paragraphs refilled to 96 columns (the figures in them are of any length), at
    most one blank line in a row, one newline at the end."""
    blocks = re.split(r"\n{2,}", text.strip("\n"))
    return "\n\n".join(block if any(KEEP.match(line) for line in block.splitlines())
                       else textwrap.fill(" ".join(block.split()), 96, break_on_hyphens=False,
                                          break_long_words=False)
                       for block in blocks) + "\n"


def readme_with(table: str, text: str | None = None) -> str:
    text = README.read_text() if text is None else text
    if not README_BLOCK.search(text):
        raise ValueError("README.md has no <!-- readme:start --> / <!-- readme:end --> block")
    return README_BLOCK.sub(lambda m: m.group(1) + table + m.group(2), text)


def write(allow_dirty: bool = False) -> list[Path]:
    page, table = render(allow_dirty)
    PAGE.write_text(page)
    README.write_text(readme_with(table))
    return [PAGE, README]


def stale(allow_dirty: bool = False) -> list[Path]:
    """The pages that differ from what the records render."""
    page, table = render(allow_dirty)
    return [p for p, want in ((PAGE, page), (README, readme_with(table)))
            if p.read_text() != want]


def cells(table: Results, names: Iterable[str]) -> list[Cell]:
    return [table(n) for n in names if table(n).runs]
