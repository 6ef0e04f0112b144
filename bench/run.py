"""The benchmark: every scenario on every system of its row, rounds interleaved, then the page.

    python bench/run.py run                     # every figure of the docs (~2 h on 2 cores)
    python bench/run.py run --quick             # every scenario once, small (a smoke run)
    python bench/run.py run --scenarios e2e,latency --systems celery-delayq,celery-redis
    python bench/run.py run --scenarios scale --rev c73efa0   # against another revision
    python bench/run.py render [--check]        # docs/benchmarks.md and README from results
    python bench/run.py list                    # the systems × scenarios table

Each round runs every scenario, and within it every system in an order that rotates by
round; every run gets a fresh state (harness.state). ``--rev REV`` adds delayq as of REV:
``git archive`` of REV in a temporary directory, whose processes import its library (they
check), its schema made by its own migrations; only the systems running delayq's code take
part, each round alternating the checkout and REV. Records go to
``bench/results/<scenario>.json`` (``--rev``: ``bench/results/ab.json``), then the page is
rendered (render.py).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import click
import records
import render
import systems
from harness import ADMIN_URL, REPO_ROOT, checkpoint, console, state
from scenarios import BY_NAME, SCENARIOS, Scenario

Entry = tuple[systems.System, str, Path | None]  # system, revision, its library's tree


@contextlib.contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    """``rev``'s files (``git archive``) in a temporary directory, removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="bench-rev-"))
    try:
        data = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO_ROOT,
                              capture_output=True, check=True).stdout
        with tarfile.open(fileobj=BytesIO(data)) as tar:
            tar.extractall(where, filter="data")
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _chosen(value: str, known: dict[str, Any], flag: str) -> set[str]:
    got = {v.strip() for v in value.split(",") if v.strip()}
    unknown = got - set(known)
    if unknown:
        raise click.BadParameter(f"unknown {sorted(unknown)}; known: {', '.join(known)}",
                                 param_hint=flag)
    return got


def plan(scenario: Scenario, chosen: set[str], entries: list[tuple[str, Path | None]],
         rnd: int) -> list[Entry]:
    """The runs of one scenario in round ``rnd``: its systems (those chosen), each at every
    revision when it runs delayq's code, in an order rotating by round."""
    runs = [(systems.get(name), rev, tree) for name in scenario.systems
            if not chosen or name in chosen
            for i, (rev, tree) in enumerate(entries)
            if i == 0 or systems.get(name).delayq]
    if len(entries) > 1:
        runs = [r for r in runs if r[0].delayq]
    shift = rnd % max(len(runs), 1)
    return runs[shift:] + runs[:shift]


def measure(scenario: Scenario, entry: Entry, rnd: int, quick: bool, cache: dict[str, Any],
            logdir: Path, admin_url: str) -> records.Record:
    system, rev, tree = entry
    params = {**scenario.params, **(scenario.quick if quick else {})}
    record: records.Record = {
        "system": system.name, "scenario": scenario.name, "revision": rev, "round": rnd + 1,
        "command": records.command(), "date": records.now(), "settings": system.settings(),
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()},
        "machine": records.machine(admin_url)}
    if tree is not None:
        record["archive"] = True
    checkpoint(admin_url)
    started = time.monotonic()
    try:
        with state(system, tree, admin_url, logdir, {**params, "_round": rnd, "_cache": cache},
                   scenario.options.get(system.name), scenario.env) as ctx:
            record["figures"] = scenario.measure(ctx)
    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
        record |= {"figures": {}, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    took = time.monotonic() - started
    shown = record.get("error") or ", ".join(f"{k} {v:g}" for k, v in record["figures"].items())
    console.print(f"[bold]{scenario.name}[/] {system.name}@{rev} round {rnd + 1} "
                  f"({took:.0f} s): {shown}", highlight=False, soft_wrap=True)
    return record


@click.group()
def main() -> None:
    """delayq's benchmark (docs/contributing.md, "Benchmarks")."""


@main.command("run")
@click.option("--quick", is_flag=True, help="Small sizes, one round: every scenario once.")
@click.option("--rounds", default=3, show_default=True, help="Interleaved rounds.")
@click.option("--scenarios", "scenario_names", default="", help="Comma-separated (default all).")
@click.option("--systems", "system_names", default="", help="Comma-separated (default all).")
@click.option("--rev", default=None, help="Also run delayq as of this git revision (an A/B).")
@click.option("--admin-url", default=ADMIN_URL, show_default=True,
              help="Admin connection; each run creates and drops its own database.")
@click.option("--render/--no-render", "do_render", default=True, show_default=True,
              help="Render docs/benchmarks.md and README's table after the run.")
def run_cmd(quick: bool, rounds: int, scenario_names: str, system_names: str,
            rev: str | None, admin_url: str, do_render: bool) -> None:
    """Run the scenarios, write their records, render the page."""
    chosen_scenarios = _chosen(scenario_names, BY_NAME, "--scenarios")
    chosen = _chosen(system_names, systems.BY_NAME, "--systems")
    todo = [s for s in SCENARIOS if not chosen_scenarios or s.name in chosen_scenarios]
    rounds = 1 if quick else rounds
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logdir = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    console.print(f"worker logs: {logdir}")
    done: list[records.Record] = []
    here = records.revision()
    if records.is_dirty({"revision": here}):
        console.print("[yellow]uncommitted changes: the renderer will refuse these records "
                      "(commit first for figures to publish)")
    with contextlib.ExitStack() as stack:
        entries: list[tuple[str, Path | None]] = [(here, None)]
        if rev is not None:
            entries.append((records.revision(rev), stack.enter_context(revision_tree(rev))))
        caches: dict[tuple[str, str, str], dict[str, Any]] = {}
        for rnd in range(rounds):
            for scenario in todo:
                if rnd >= (1 if quick else scenario.rounds or rounds):
                    continue
                for entry in plan(scenario, chosen, entries, rnd):
                    cache = caches.setdefault((scenario.name, entry[0].name, entry[1]),
                                              {"_stack": stack})
                    done.append(measure(scenario, entry, rnd, quick, cache, logdir,
                                        admin_url))
                _save(done, rev is not None)
    if do_render and rev is None and not records.is_dirty({"revision": here}):
        render.write()


def _save(done: list[records.Record], ab: bool) -> None:
    if ab:
        records.save("ab", done, replace_all=True)
        return
    for name in {r["scenario"] for r in done}:
        records.save(name, [r for r in done if r["scenario"] == name])


@main.command("render")
@click.option("--check", is_flag=True, help="Change nothing; exit 1 if a page differs.")
def render_cmd(check: bool) -> None:
    """Render docs/benchmarks.md and README's table from bench/results (refuses a record of
    a revision with uncommitted changes)."""
    if check:
        stale = render.stale()
        for path in stale:
            console.print(f"{path} differs from what bench/results render")
        raise SystemExit(int(bool(stale)))
    render.write()


@main.command("list")
def list_cmd() -> None:
    """Which systems each scenario runs."""
    for scenario in SCENARIOS:
        click.echo(f"{scenario.name:12} {', '.join(scenario.systems)}")


if __name__ == "__main__":
    main()
