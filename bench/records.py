"""Result records: one per system, scenario and round, flat, in ``bench/results/<name>.json``
(a JSON list). Every record holds

    {"system", "scenario", "revision", "round", "figures": {name: number}, "command", "date"}

and, from this harness, ``settings`` (what the system row states: its configuration and
durability), ``params`` (the scenario's sizes) and ``machine``; a failed run has ``error`` and
no figures; a run of ``--rev``'s ``git archive`` has ``archive`` (an A/A's sides differ by
it). ``revision`` is the short commit measured, ``+dirty`` when the checkout had uncommitted
changes to anything but the results and the pages they render: the renderer refuses those
(:func:`is_dirty`), so every published figure names a commit.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
#: What a run writes (so a run's own output does not make the revision it measures dirty).
OUTPUTS = ("bench/results", "docs/benchmarks.md", "README.md")
Record = dict[str, Any]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def revision(rev: str = "HEAD") -> str:
    """The short commit of ``rev``; for HEAD with ``+dirty`` when the tree has changes."""
    sha = git("rev-parse", "--short", f"{rev}^{{commit}}")
    if rev != "HEAD":
        return sha
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  *(f":!{p}" for p in OUTPUTS))
    return f"{sha}+dirty" if changed else sha


def is_dirty(record: Record) -> bool:
    return str(record.get("revision", "")).endswith("+dirty")


def command() -> str:
    """How the harness was started (an option naming a URL shown as ``…``: it is this
    machine's and may hold a password)."""
    shown, hide = ["python bench/run.py"], False
    for arg in sys.argv[1:]:
        if hide:
            arg, hide = "…", False
        elif arg.startswith("--") and "url" in arg:
            arg, hide = (arg.split("=")[0] + "=…", False) if "=" in arg else (arg, True)
        shown.append(shlex.quote(arg) if arg != "…" else arg)
    return " ".join(shown)


def machine(admin_url: str) -> str:
    """Cores, CPU, PostgreSQL and Python: what two runs must share to be compared."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    pg = str(row[0]).split()[0] if row else "?"
    return f"{os.cpu_count()} × {model}, PostgreSQL {pg}, Python {platform.python_version()}"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def load(name: str) -> list[Record]:
    """The records of ``bench/results/<name>.json`` (a list, or ``{"records": [...]}``)."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return list(data["records"] if isinstance(data, dict) else data)


def names() -> list[str]:
    return sorted(p.stem for p in RESULTS_DIR.glob("*.json"))


def save(name: str, run: list[Record], replace_all: bool = False) -> Path:
    """Write this run's records of ``name``: they replace every stored record of the same
    (system, scenario), or, with ``replace_all``, the whole file."""
    touched = {(r["system"], r["scenario"]) for r in run}
    kept = [] if replace_all else [r for r in load(name)
                                   if (r["system"], r["scenario"]) not in touched]
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(kept + run, indent=1, sort_keys=True) + "\n")
    return path
