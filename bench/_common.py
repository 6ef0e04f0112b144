"""Helpers the delayq benchmarks and diagnostics share, so each script only describes its
workloads.

- a throw-away database per run (:func:`fresh_database`), so results never depend on what a
  previous run or a test left behind, and the table states several scripts build
  (:func:`load_far_rows`, :func:`hold_snapshot`, :func:`table_stats`);
- what a reader needs to compare two runs (:func:`machine_info`, :func:`git_revision`) and the
  CPU and memory of processes and of the whole machine (psutil);
- percentiles and medians computed the same way everywhere;
- rich progress bars (:func:`progress_bar`), JSON results in ``bench/results/<name>.json``
  (:func:`write_results`), the sections of ``docs/benchmarks.md`` rewritten in place between
  ``<!-- name:start -->`` / ``<!-- name:end -->`` markers (:func:`replace_section`), each
  opening with the same line naming command, revision, date and machine (:func:`run_line`),
  and a grouped bar chart.

A helper only one benchmark uses lives next to it instead (``_core_meter.py``,
``_steady.py``, ``_scale_snapshot.py``, ``_celery*.py``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
import psutil
import psycopg
from psycopg import sql
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DOCS_DIR = REPO_ROOT / "docs"
BENCHMARKS_MD = DOCS_DIR / "benchmarks.md"
IMG_DIR = DOCS_DIR / "img"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: The queue table every delayq benchmark uses (``DelayedQueue``'s default).
TABLE = "delayed_queue"
#: Far-future rows are due this far ahead: never due while a benchmark runs.
FAR_FUTURE_MS = 30 * 86_400_000

BENCHMARKS_INTRO = """# Benchmarks

Every figure below is produced by a script under `bench/` against a fresh PostgreSQL database
the script creates and drops. Each section sits between `<!-- name:start -->` /
`<!-- name:end -->` markers and is rewritten by its script; raw results are kept in
`bench/results/<name>.json`.
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


def load_far_rows(url: str, kind: str, n: int, table: str = TABLE, first: int = 0) -> float:
    """Rows ``first`` to ``first + n - 1`` of ``kind`` due in 30 days, by generate_series in
    steps of a million (seconds for millions, where offers would take hours); returns seconds.
    """
    start = time.monotonic()
    step = 1_000_000
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(first, first + n, step):
            conn.execute(sql.SQL("""
                INSERT INTO {} ("pKey", "pKind", payload, "scheduledAt",
                                "scheduledAtInitially", "createdAt")
                SELECT 'far-' || i, %(kind)s, '\\x00', t + i, t + i, t
                FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i,
                     (SELECT (extract(epoch FROM now()) * 1000)::bigint + %(far)s AS t) AS n
            """).format(sql.Identifier(table)),
                {"kind": kind, "lo": lo, "hi": min(lo + step, first + n) - 1,
                 "far": FAR_FUTURE_MS})
    return time.monotonic() - start


def hold_snapshot(url: str, table: str = TABLE) -> psycopg.Connection[Any]:
    """A REPEATABLE READ transaction that has read the table: its snapshot pins the xmin
    horizon (nothing deleted after it can be vacuumed) until the connection closes, as a
    long ``pg_dump`` does."""
    conn = psycopg.connect(url)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE false").format(sql.Identifier(table)))
    return conn


def table_stats(url: str, table: str = TABLE) -> dict[str, Any]:
    """Sizes, dead tuples and autovacuum visits of one table: what churn leaves behind."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("""
            SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), s.n_dead_tup, s.n_live_tup,
                   s.autovacuum_count, s.autoanalyze_count,
                   (SELECT sum(i.idx_blks_hit + i.idx_blks_read) FROM pg_statio_user_indexes AS i
                    WHERE i.relid = c.oid AND i.indexrelname LIKE '%%KindPlusScheduledAt%%')
            FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
            WHERE c.oid = %s::regclass""", [table]).fetchone()
    assert row is not None
    # The last: pages of the (pKind, scheduledAt) index read so far, what the polls walk.
    keys = ("table_bytes", "index_bytes", "dead_tuples", "live_tuples", "autovacuums",
            "autoanalyzes", "kind_index_pages")
    return dict(zip(keys, row, strict=True))


# -- the machine and its processes ------------------------------------------------------


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


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of one process; 0 once it is gone (a backend that ended)."""
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _tree(pid: int) -> list[psutil.Process]:
    """A process and its children (a worker and its pool); empty once it is gone."""
    try:
        main = psutil.Process(pid)
        return [main, *main.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu(pids: Iterable[int]) -> float:
    """CPU seconds of these processes and all their children."""
    return sum(cpu_seconds(p) for pid in pids for p in _tree(pid))


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its children (0 once it is gone)."""
    total = 0
    for proc in _tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of all cores since boot: every process and the kernel's
    interrupt work, so what the processes a script names leave out shows up."""
    times = psutil.cpu_times()
    total = sum(times)
    return total - times.idle - getattr(times, "iowait", 0.0), total


# -- statistics -------------------------------------------------------------------------


def percentile(values: Sequence[float], q: int) -> float | None:
    """The ``q``-th percentile (1-99), interpolated between the closest ranks
    (``method="inclusive"``) so that a window of a few samples still has one; None if empty."""
    if len(values) < 2:
        return float(values[0]) if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def median_of(rows: Iterable[dict[str, Any]], key: str, digits: int = 2) -> float | None:
    """Median of ``row[key]`` over the rows that have it (None if none do)."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), digits) if values else None


def spread(median: float, low: float, high: float, fmt: str = "{:,.1f}") -> str:
    """A median with the rounds' min-max, one format for all three: ``"4.2 (3.9–5.0)"``; the
    median alone when the rounds agree (or there was one)."""
    text = fmt.format(median)
    lo, hi = fmt.format(low), fmt.format(high)
    return text if lo == hi else f"{text} ({lo}–{hi})"


# -- processes ------------------------------------------------------------------------


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def handle_stop_signals() -> None:
    """SIGTERM stops a bench as Ctrl-C does (its workers, producers and databases are cleaned
    up by the ``finally`` blocks), and Ctrl-C reaches it even when started from a shell that
    ignores SIGINT in the background (``nohup … &``)."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def wait_for_log(proc: subprocess.Popen[bytes], log_path: Path, line: str, count: int = 1,
                 timeout: float = 90.0) -> None:
    """Wait until a worker's log holds ``line`` ``count`` times (its ready line, once per
    process it forks); a clear error with the log's tail if it exits or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log_path.read_text(errors="replace").count(line) >= count:
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"worker not ready (see {log_path}):\n{tail}")


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


# -- results and documents ------------------------------------------------------------


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` with a timestamp; returns the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "finished_at": datetime.now(UTC).isoformat(timespec="seconds")}
    payload.update(data)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def load_results(name: str) -> dict[str, Any]:
    """``bench/results/<name>.json`` as written (empty if there is none)."""
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def command_line() -> str:
    """How this script was started, for its docs section; the value of an option naming a
    URL is left out (it may hold a password, and it is this machine's, not the reader's)."""
    script = Path(sys.argv[0]).resolve()
    where = script.relative_to(REPO_ROOT) if script.is_relative_to(REPO_ROOT) else script
    shown = [f"python {where}"]
    hide_next = False
    for arg in sys.argv[1:]:
        if hide_next:
            arg, hide_next = "…", False
        elif arg.startswith("--") and "url" in arg.split("=", 1)[0]:
            arg, hide_next = (arg.split("=", 1)[0] + "=…", False) if "=" in arg else (arg, True)
        shown.append(arg)
    return " ".join(shown)


def run_line(command: str, revision: str | None, finished_at: str | None,
             machine: dict[str, Any] | None, load: tuple[float, float] | None = None) -> str:
    """The sentence every section opens with: what was run, at which revision, when, where.

    Two runs are only comparable on the same machine; the load average says whether anything
    else ran meanwhile (the benchmark's own processes count in it).
    """
    when = "date not recorded"
    if finished_at:
        when = datetime.fromisoformat(finished_at).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = "machine not recorded"
    if machine:
        pg = machine.get("postgresql", {}).get("server_version", "?").split()[0]
        where = (f"{machine.get('cpu_count', '?')} × {machine.get('cpu_model', '?')}, "
                 f"PostgreSQL {pg}, Python {machine.get('python', '?')}")
    text = f"`{command}`, revision {revision or 'not recorded'}, {when}; {where}"
    if load is not None:
        text += f"; load average {load[0]:.1f} → {load[1]:.1f}"
    return prose(text + ".")


def prose(text: str, width: int = 96) -> str:
    """Paragraphs (separated by blank lines) refilled to ``width``: a writer's sentences hold
    figures of any length, and the page should read the same whatever they were."""
    return "\n\n".join(textwrap.fill(" ".join(p.split()), width, break_on_hyphens=False,
                                      break_long_words=False)
                         for p in text.strip().split("\n\n"))


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


def with_section(text: str, name: str, body: str) -> str:
    """``text`` with ``body`` between this section's markers, every other section untouched;
    the section is appended when its markers are not there yet."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        return before + block + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


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


# -- the one rounding rule of docs/benchmarks.md -------------------------------------------
#
# A figure read from one results file is shown the same wherever it appears (its section, the
# targets table, README): ratios with two decimals, percentages and rates with none, each to
# the nearest, and a target is judged on the figure as shown, so a figure and its verdict
# never disagree (a 1.2995 ratio shows as 1.30× and meets "≥ 1.3×").


def shown_ratio(value: float) -> float:
    return round(value, 2)


def times(value: float) -> str:
    """A ratio as every page shows it: ``1.03×``."""
    return f"{shown_ratio(value):.2f}×"


def percent(value: float) -> str:
    """A fraction as every page shows it: ``91%``."""
    return f"{round(value * 100):.0f}%"


def at_least(ratio: float, target: float) -> bool:
    return shown_ratio(ratio) >= target


def at_most(ratio: float, target: float) -> bool:
    return shown_ratio(ratio) <= target


def verdict(ok: bool | None, unknown: str = "not measured") -> str:
    return unknown if ok is None else "yes" if ok else "**no**"


@dataclass(frozen=True)
class TargetRow:
    """One row of the page's "Targets at a glance": each writer's ``targets(data)`` makes its
    rows from the same figures and rules as its section."""

    area: str
    target: str
    measured: str
    holds: str


def revision_cell(data: dict[str, Any]) -> str:
    """``c477047\\*, 2026-11-25``: the run's revision (``*``: uncommitted changes) and day."""
    revision = str(data.get("revision") or data.get("git_revision") or "not recorded")
    revision = revision.replace(" (with uncommitted changes)", "\\*")
    when = data.get("finished_at")
    day = datetime.fromisoformat(when).astimezone(UTC).strftime("%Y-%m-%d") if when else "?"
    return f"{revision}, {day}"
