"""Helpers every delayq benchmark shares, so each bench script only describes its workloads.

- a throw-away database per run (:func:`fresh_database`), so results never depend on what a
  previous run or a test left behind;
- time-boxed measurement with an untimed preparation step and refills (:class:`Meter`,
  :func:`measure`), so a rate is units over the seconds spent in the measured calls only, and
  :func:`measure_interleaved` to compare workloads under the same background load;
- rich progress bars (:func:`progress_bar`), JSON results in ``bench/results/<name>.json``
  (:func:`write_results`), markdown tables and sections of ``docs/benchmarks.md`` rewritten in
  place between ``<!-- name:start -->`` / ``<!-- name:end -->`` markers, and a grouped bar chart.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
import psycopg
from psycopg import sql
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DOCS_DIR = REPO_ROOT / "docs"
BENCHMARKS_MD = DOCS_DIR / "benchmarks.md"
IMG_DIR = DOCS_DIR / "img"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: How often a running measurement redraws its bar; redrawing per call would slow fast loops.
PROGRESS_REFRESH_S = 0.1

BENCHMARKS_INTRO = """# Benchmarks

Every figure below is produced by a script under `bench/` in one run on the machine named in
its section, against a fresh PostgreSQL database the script creates and drops. Each section
sits between `<!-- name:start -->` / `<!-- name:end -->` markers and is rewritten by its
script; raw results are kept in `bench/results/<name>.json`.
"""

console = Console(stderr=True)

#: The ``--database-url`` option of every bench: an admin connection, never the data itself.
database_url_option = click.option(
    "--database-url", default=DEFAULT_ADMIN_URL, show_default=True,
    help="Admin connection; the bench creates and drops its own database.",
)


# -- databases ------------------------------------------------------------------------


def url_for(admin_url: str, dbname: str) -> str:
    """The admin URL pointing at another database of the same server."""
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{dbname}"))


@contextmanager
def fresh_database(admin_url: str, prefix: str = "delayq_bench") -> Iterator[str]:
    """Create an empty database for one run and drop it afterwards, even on Ctrl-C."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    ident = sql.Identifier(name)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        yield url_for(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def checkpoint(admin_url: str) -> None:
    """Flush PostgreSQL's dirty pages now, so the checkpoint a previous phase left due (its
    database's DROP, a 100,000-row table) is not paid by the next phase, whatever its broker."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        try:
            admin.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass  # not superuser (nor pg_checkpoint): the phases share whatever comes


def vacuum_analyze(url: str, table: str) -> None:
    """Fresh statistics and visibility map, so every phase starts from the same table state."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))


def machine_info(url: str) -> dict[str, Any]:
    """What a reader needs to compare two runs: cores, versions, durability settings."""
    names = ("server_version", "synchronous_commit", "fsync", "shared_buffers")
    with psycopg.connect(url) as conn:
        show = [conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchall()
                for name in names]
    settings = {name: str(rows[0][0]) for name, rows in zip(names, show, strict=True)}
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__,
        "postgresql": settings,
        "load_average_at_start": list(os.getloadavg()),
    }


def git_revision() -> str:
    """The commit measured, flagged when the working tree differs from it."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{rev}{' (with uncommitted changes)' if dirty else ''}"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else "unknown"


# -- measuring ------------------------------------------------------------------------


@dataclass
class Sample:
    """One time-boxed measurement: ``units`` processed in ``seconds`` of measured calls."""

    units: int
    seconds: float
    refills: int = 0

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Series:
    """Repeated samples of one workload; the median is the reported figure."""

    samples: list[Sample] = field(default_factory=list)

    @property
    def median_rate(self) -> float:
        return statistics.median(s.rate for s in self.samples) if self.samples else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "median_per_s": round(self.median_rate, 1),
            "samples": [dict(asdict(s), rate_per_s=round(s.rate, 1)) for s in self.samples],
        }


def paired_ratio(numerator: Series, denominator: Series) -> float:
    """Median of per-round ratios: samples at the same index ran interleaved, under one load."""
    ratios = [a.rate / b.rate for a, b in zip(numerator.samples, denominator.samples, strict=True)
              if b.rate > 0]
    return statistics.median(ratios) if ratios else 0.0


class Exhausted(Exception):
    """Raised by a step that ran out of input (an empty queue): refill, then go on."""


@dataclass
class Workload:
    """``step(prepare())`` processes some units and returns how many; only ``step`` is timed.

    ``prepare`` builds inputs (keys, message lists) with the clock stopped.
    """

    step: Callable[[Any], int]
    prepare: Callable[[], Any] = lambda: None


class Meter:
    """Accumulates units and seconds spent inside one workload's ``step`` across many slices.

    ``refill`` runs untimed whenever ``step`` raises :class:`Exhausted`; ``on_progress``
    receives (seconds, units) at most every ``PROGRESS_REFRESH_S``.
    """

    def __init__(
        self,
        work: Workload,
        *,
        refill: Callable[[], None] | None = None,
        on_progress: Callable[[float, int], None] | None = None,
    ) -> None:
        self.work, self.refill, self.on_progress = work, refill, on_progress
        self.spent, self.units, self.refills = 0.0, 0, 0
        self._next_report = 0.0

    def run_for(self, seconds: float) -> None:
        """Run whole steps until at least ``seconds`` more have been spent inside them."""
        until = self.spent + seconds
        while self.spent < until:
            arg = self.work.prepare()
            started = time.perf_counter()
            try:
                self.units += self.work.step(arg)
            except Exhausted:
                self.spent += time.perf_counter() - started
                if self.refill is None:
                    raise
                self.refill()
                self.refills += 1
                continue
            self.spent += time.perf_counter() - started
            if self.on_progress is not None and self.spent >= self._next_report:
                self.on_progress(self.spent, self.units)
                self._next_report = self.spent + PROGRESS_REFRESH_S
        if self.on_progress is not None:
            self.on_progress(self.spent, self.units)

    def sample(self) -> Sample:
        return Sample(units=self.units, seconds=self.spent, refills=self.refills)


def measure(work: Workload, *, seconds: float, **meter_kwargs: Any) -> Sample:
    """One workload alone for at least ``seconds`` of measured time."""
    meter = Meter(work, **meter_kwargs)
    meter.run_for(seconds)
    return meter.sample()


def measure_interleaved(
    meters: dict[str, Meter], *, seconds: float, slice_seconds: float
) -> dict[str, Sample]:
    """Alternate the workloads in short slices until each has ``seconds`` of measured time.

    On a shared machine the background load changes from one second to the next; slicing
    makes every side see the same load, so their ratio stays meaningful even when the
    absolute rates do not. A slice is at least one whole step.
    """
    while any(m.spent < seconds for m in meters.values()):
        for meter in meters.values():
            if meter.spent < seconds:
                meter.run_for(min(slice_seconds, seconds - meter.spent))
    return {name: m.sample() for name, m in meters.items()}


# -- progress -------------------------------------------------------------------------


def progress_bar() -> Progress:
    """The bar every bench shows: what runs, how far, for how long, at what rate.

    Tasks need the fields ``rate`` and ``unit``: ``progress.add_task(d, total=n, rate="",
    unit="phases")``, or use :func:`timed_task`.
    """
    return Progress(
        TextColumn("[bold]{task.description}", justify="left"),
        BarColumn(),
        TextColumn("{task.completed:>6.1f}/{task.total:<4g} {task.fields[unit]}"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def timed_task(progress: Progress, description: str, seconds: float) -> TaskID:
    """A task whose bar fills with measured seconds (``measure``'s ``on_progress``)."""
    return progress.add_task(description, total=round(seconds, 1), rate="", unit="s")


def reporter(progress: Progress, task: TaskID, unit: str = "msgs") -> Callable[[float, int], None]:
    """An ``on_progress`` callback that moves ``task`` and shows the running rate."""

    def report(spent: float, units: int) -> None:
        rate = units / spent if spent > 0 else 0.0
        progress.update(task, completed=round(spent, 1), rate=f"{rate:>10,.0f} {unit}/s")

    return report


# -- results and documents ------------------------------------------------------------


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` with a timestamp; returns the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "finished_at": datetime.now(UTC).isoformat(timespec="seconds")}
    payload.update(data)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None
) -> str:
    """A GitHub table; ``align`` is one of ``l``/``r``/``c`` per column (default: left)."""
    align = align or "l" * len(headers)
    if len(align) != len(headers) or any(len(r) != len(headers) for r in rows):
        raise ValueError("every row and the alignment need one entry per header")
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join(marks[a] for a in align) + " |",
    ]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def replace_section(name: str, body: str, path: Path = BENCHMARKS_MD) -> Path:
    """Put ``body`` between this bench's markers, leaving every other section untouched.

    Creates the file with the shared intro when missing; appends the section when its
    markers are not there yet.
    """
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else BENCHMARKS_INTRO
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def grouped_bar_chart(
    path: Path,
    categories: Sequence[str],
    series: dict[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    log_scale: bool = False,
    targets: Sequence[float | None] | None = None,
) -> Path:
    """Bars per category, one colour per series, values printed on top; saved as PNG.

    ``targets`` (one per category, None for none) are drawn as dashed lines across the group.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(7.0, 2.4 * len(categories)), 4.2))
    for i, (label, values) in enumerate(series.items()):
        xs = [c + (i - (len(series) - 1) / 2) * width for c in range(len(categories))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7, padding=2)
    labelled = False
    for c, target in enumerate(targets or []):
        if target is not None:
            ax.hlines(target, c - 0.45, c + 0.45, colors="black", linestyles="dashed",
                      label="_nolegend_" if labelled else "target")
            labelled = True
    ax.set_xticks(range(len(categories)), list(categories), fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log_scale:
        ax.set_yscale("log")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
    """Lay out, write and close a matplotlib figure (every bench plot ends this way)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"
