"""A/B variants of delayq inside one ``bench_celery.py`` run, rounds interleaved.

A mechanism is judged against the revision before it on the same machine in the same run: a
shared machine drifts by more than most mechanisms are worth between two runs. So besides the
plain broker names, ``--brokers`` takes

- ``delayq@REV`` (and ``delayq_durable@REV``): the producers and the worker import delayq from
  ``REV`` (any git revision: a commit, a branch, a tag), exported with ``git archive`` into a
  temporary directory that is removed when the run ends (the repository and its worktrees are
  not touched). Only the library comes from ``REV``: the harness and the app are this checkout's;
- ``delayq~NAME=VALUE`` (repeatable, also after ``@REV``): a transport option on top of the
  broker's own, the value read as JSON when it parses (``~durable_acks=true``), else as text.

Worker and producer processes check at start that they import delayq from where they should.

``bench_burst.py`` also varies one line: :func:`window_tree` is a revision's library (or this
checkout's) with the wake-up window ``DEFAULT_WINDOW_S`` of core/queue/announce.py set to another
value, run through :func:`tree_env` like a revision.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    BENCH_DIR,
    REPO_ROOT,
    times,
)

_SPEC = re.compile(r"^(?P<base>delayq(?:_durable)?)(?:@(?P<rev>[\w./-]+))?"
                   r"(?P<opts>(?:~\w+=[^~]*)*)$")
#: Set in a variant's environment: the directory its processes must import delayq from.
ROOT_ENV = "BENCH_DELAYQ_ROOT"
_TREES: dict[str, Path] = {}


@dataclass(frozen=True)
class Variant:
    """A broker name of the form above, taken apart."""

    base: str
    rev: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def parse(name: str) -> Variant | None:
    """The variant ``name`` spells, or None when it is a plain broker name."""
    match = _SPEC.match(name)
    if match is None or (not match["rev"] and not match["opts"]):
        return None
    options: dict[str, Any] = {}
    for item in match["opts"].split("~")[1:]:
        key, _, raw = item.partition("=")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return Variant(match["base"], match["rev"], options)


def is_variant(name: str) -> bool:
    return parse(name) is not None


def safe_name(name: str) -> str:
    """``name`` with what a node name, a file or a database name cannot hold replaced."""
    return re.sub(r"[^\w.-]", "_", name)


def source_tree(rev: str) -> Path:
    """The library of ``rev``, exported once per run (``git archive``), removed at exit."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    if sha not in _TREES:
        tree = Path(tempfile.mkdtemp(prefix=f"delayq-ab-{sha[:10]}-"))
        archive = subprocess.run(["git", "archive", "--format=tar", sha], cwd=REPO_ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        _TREES[sha] = tree
    return _TREES[sha]


#: The one line :func:`window_tree` sets, and the file that holds it.
WINDOW_FILE = Path("delayq_transport/core/queue/announce.py")
_WINDOW_LINE = re.compile(r"^DEFAULT_WINDOW_S = .*$", re.MULTILINE)
#: The packages a tree of this checkout holds (what ``git archive`` of a revision gives too).
_PACKAGES = ("delayq_transport", "delayq_beat")


def window_tree(rev: str | None, window_ms: float) -> Path:
    """The library of ``rev`` (None: this checkout's working tree, uncommitted changes
    included) with ``DEFAULT_WINDOW_S`` set to ``window_ms``, copied once per run and removed
    at exit; a clear error when that revision has no such line (the window is gone or moved)."""
    key = f"{rev or '.'}~window_ms={window_ms:g}"
    if key not in _TREES:
        tree = Path(tempfile.mkdtemp(prefix="delayq-ab-window-"))
        _TREES[key] = tree
        ignore = shutil.ignore_patterns("__pycache__")
        if rev is None:
            for package in _PACKAGES:
                shutil.copytree(REPO_ROOT / package, tree / package, ignore=ignore)
        else:
            shutil.copytree(source_tree(rev), tree, ignore=ignore, dirs_exist_ok=True)
        path = tree / WINDOW_FILE
        text, found = _WINDOW_LINE.subn(f"DEFAULT_WINDOW_S = {window_ms / 1000!r}",
                                        path.read_text())
        if found != 1:
            raise ValueError(f"{WINDOW_FILE} at {rev or 'this checkout'} has {found} lines "
                             "`DEFAULT_WINDOW_S = ...`, not one: --window-ms cannot set it")
        path.write_text(text)
    return _TREES[key]


@atexit.register
def remove_trees() -> None:
    for tree in _TREES.values():
        shutil.rmtree(tree, ignore_errors=True)
    _TREES.clear()


def variant_env(env: dict[str, str], variant: Variant) -> dict[str, str]:
    """``env`` (a broker's, from ``_celery.base_env``) with the variant's options and, for a
    revision, a PYTHONPATH that finds that revision's delayq before this checkout's."""
    env = dict(env)
    options = {**json.loads(env["BENCH_TRANSPORT_OPTIONS"]), **variant.options}
    env["BENCH_TRANSPORT_OPTIONS"] = json.dumps(options)
    return env if variant.rev is None else tree_env(env, source_tree(variant.rev))


def tree_env(env: dict[str, str], tree: Path) -> dict[str, str]:
    """``env`` with a PYTHONPATH that finds ``tree``'s delayq before this checkout's, and the
    variable its processes check that against (:func:`check_import`)."""
    env = dict(env)
    ours = {str(REPO_ROOT), str(REPO_ROOT) + os.sep}
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and p not in ours and p != str(BENCH_DIR)]
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), str(tree), *rest])
    env[ROOT_ENV] = str(tree)
    return env


@contextmanager
def spawn_path(env: dict[str, str]) -> Iterator[None]:
    """While a spawn pool starts its processes for ``env``: they take the parent's
    ``sys.path``, not PYTHONPATH, so the variant's tree goes first in it meanwhile."""
    root = env.get(ROOT_ENV)
    if root is None:
        yield
        return
    saved = list(sys.path)
    sys.path.insert(0, root)
    try:
        yield
    finally:
        sys.path[:] = saved


def check_import(env: dict[str, str] | None = None) -> str:
    """Where this process imported delayq from; raises when a variant's process did not
    import it from the variant's tree (a measurement of the wrong code is worse than none)."""
    import delayq_transport

    where = str(Path(delayq_transport.__file__).resolve().parent.parent)
    root = (env or os.environ).get(ROOT_ENV)
    if root is not None and Path(where) != Path(root).resolve():
        raise RuntimeError(f"variant process imported delayq from {where}, not {root}")
    return where


_CPU_PARTS = ("producers_us", "worker_main_us", "worker_pool_us", "server_us", "pg_aux_us")


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def ab_rows(results: dict[str, Any], brokers: list[str], phase: str) -> list[list[str]]:
    """One row per broker of a throughput phase: the median rate (every round's), its ratio to
    the first broker's, and each side's CPU per task, the median over the rounds."""
    rows = []
    base = (results.get(brokers[0], {}).get(phase) or {}).get("tasks_per_s")
    for broker in brokers:
        got = results.get(broker, {}).get(phase) or {}
        rate = got.get("tasks_per_s")
        if rate is None:
            rows.append([broker, phase, got.get("error", "—")] + [""] * 8)
            continue
        rounds = got.get("rounds_tasks_per_s") or [rate]
        cpus = got.get("rounds_cpu_us_per_task") or [got.get("cpu_us_per_task") or {}]
        parts = [_median([c.get(k) for c in cpus if c]) for k in _CPU_PARTS]
        total = sum(p for p in parts if p is not None)
        rows.append([broker, phase, f"{rate:,.0f}",
                     " ".join(f"{r:,.0f}" for r in rounds if r),
                     times(rate / base) if base else "—",
                     *("—" if p is None else f"{p:,.0f}" for p in parts), f"{total:,.0f}"])
    return rows


AB_HEADERS = ["broker", "phase", "tasks/s (median)", "rounds", "vs first",
              "producers µs", "worker main µs", "pool µs", "server µs", "PG aux µs",
              "total µs/task"]
