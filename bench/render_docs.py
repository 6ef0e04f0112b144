"""Rewrite the generated sections of docs/benchmarks.md from the stored results, running nothing.

Every benchmark writes its section of the page from its results file
(``bench/results/<name>.json``) and nothing else, with the same ``section(data)`` this calls.
After changing what a writer shows, this brings the page in line with it without re-running a
benchmark; ``--check`` only says whether the page and the writers agree (exit status 1 if not).
README's comparison table (``_readme.py``), and the page's targets table and "Where delayq is
behind" (``_targets.py``), are rendered from the same results.

    python bench/render_docs.py [--check] [SECTION ...]
"""

from __future__ import annotations

import importlib
import sys

import _readme
import _targets
import click
from _common import BENCHMARKS_MD, REPO_ROOT, console, load_results, with_section

README = REPO_ROOT / "README.md"

#: Section name -> the module whose ``section(data)`` writes it (its results file has the
#: section's name).
SECTIONS = {
    "core": "bench_core",
    "beat": "bench_beat",
    "spark": "bench_spark",
    "celery": "_celery_report",
    "counts": "bench_counts",
    "web": "bench_web",
    "web_bulk": "bench_web",
    "dramatiq": "bench_dramatiq",
    "churn_churn": "bench_churn",
    "churn_snapshot": "bench_churn",
    "scale": "bench_scale",
    "scale_ab": "bench_scale",
    "scale_snapshot": "_scale_snapshot",
    "failover": "bench_failover",
    "connection_budget": "connection_budget",
    "connection_budget_single_pool": "connection_budget",
    "transaction": "bench_transaction",
    "celery_pgbouncer": "_hand_recorded",
    "scale_10m": "_hand_recorded",
    "task_account": "_hand_recorded",
    "burst": "_burst_report",
    "peers": "_burst_report",
    "many_workers": "_burst_report",
    "djtasks": "bench_djtasks",
}
#: README's comparison table: its own writer, from several results files.
README_SECTION = "readme"


@click.command()
@click.argument("names", nargs=-1, type=click.Choice(sorted(SECTIONS)))
@click.option("--check", is_flag=True,
              help="Change nothing; exit 1 if a section differs from what its writer makes.")
def main(names: tuple[str, ...], check: bool) -> None:
    """Rewrite the page's generated sections (all, or NAMES) from bench/results/*.json."""
    before = text = BENCHMARKS_MD.read_text()
    for name in names or tuple(SECTIONS):
        data = load_results(name)
        if not data:
            console.print(f"{name}: no results file, section left as it is")
            continue
        changed = with_section(text, name, importlib.import_module(SECTIONS[name]).section(data))
        if changed != text:
            console.print(f"{name}: {'differs' if check else 'rewritten'}")
        text = changed
    readme_before = readme = README.read_text()
    if not names:
        every = {name: load_results(name) for name in _targets.SOURCES}
        for name, writer in _targets.SUMMARIES.items():
            changed = with_section(text, name, writer(every))
            if changed != text:
                console.print(f"{name}: {'differs' if check else 'rewritten'}")
            text = changed
        readme = with_section(readme, README_SECTION, _readme.section(
            {name: load_results(name) for name in _readme.SOURCES}))
        if readme != readme_before:
            console.print(f"README.md: {'differs' if check else 'rewritten'}")
    if check:
        sys.exit(int(text != before or readme != readme_before))
    BENCHMARKS_MD.write_text(text)
    README.write_text(readme)
    console.print(f"{BENCHMARKS_MD.relative_to(REPO_ROOT)}: {len(text.splitlines())} lines")


if __name__ == "__main__":
    main()
