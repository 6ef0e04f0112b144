"""Plant known bugs in a copy of the checkout and check that the tests named for each one fail.

Each mutation in ``catalogue.py`` replaces one exact piece of source text with a bug (the
text must occur exactly once) and names the tests that must catch it. For each one, this
copies the checkout (without ``.git``) to a temporary folder, plants the bug there, runs the
named tests against the copy (``PYTHONPATH`` and the working folder point at it) and expects
pytest to report failures; then it runs the same tests on an unmodified copy, which must pass
(a test that fails either way proves nothing). The checkout itself is never modified.

    python tests/mutations/check.py --list          # the catalogue
    python tests/mutations/check.py                 # every mutation (acceptance ones included)
    python tests/mutations/check.py dead-letter-expiry entry-hash-order
    flock /tmp/delayq-heavy.lock python tests/mutations/check.py --tier acceptance

Exit status 0 when every mutation selected was caught (and every control passed). Needs what
the suite needs (PostgreSQL; Redis or a worker for some).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from catalogue import MUTATIONS, Mutation  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: bench/results is copied: the rendered pages are checked against its records.
SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache",
                              "spark-warehouse")


def copy_tree(dest: Path) -> Path:
    tree = dest / "delayq"
    shutil.copytree(ROOT, tree, ignore=SKIP, symlinks=True)
    return tree


def plant(tree: Path, m: Mutation) -> None:
    path = tree / m.path
    text = path.read_text()
    found = text.count(m.old)
    if found != 1:
        raise SystemExit(f"{m.name}: the text to replace occurs {found} times in {m.path} "
                         "(the code moved: update tests/mutations/catalogue.py)")
    path.write_text(text.replace(m.old, m.new))


def run_tests(tree: Path, tests: list[str], log: Path) -> int:
    """pytest's exit code on ``tests`` in ``tree`` (output to ``log``)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with open(log, "wb") as out:
        return subprocess.call([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly",
                                "--durations=0", *tests], cwd=tree, env=env, stdout=out,
                               stderr=subprocess.STDOUT)


def check(m: Mutation, workdir: Path, control: bool) -> bool:
    tree = copy_tree(workdir / m.name)
    if control:
        rc = run_tests(tree, m.tests, workdir / f"{m.name}.control.log")
        if rc != 0:
            print(f"  {m.name}: the tests FAIL WITHOUT the bug (rc {rc}): see "
                  f"{workdir / (m.name + '.control.log')}")
            return False
    plant(tree, m)
    log = workdir / f"{m.name}.log"
    rc = run_tests(tree, m.tests, log)
    caught = rc == 1  # tests failed; 2-5: interrupted, usage error, nothing collected
    status = "caught" if caught else f"NOT CAUGHT (pytest rc {rc}, log {log})"
    print(f"  {m.name}: {status}")
    if caught:
        failed = [ln for ln in log.read_text(errors="replace").splitlines()
                  if ln.startswith("FAILED ")]
        for line in failed[-3:]:
            print(f"      {line[:160]}")
    return caught


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to check (default: all)")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--tier", help="only mutations whose tests are in tests/<tier>")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the run without the bug (faster; proves less)")
    parser.add_argument("--keep", action="store_true", help="keep the copies and logs")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if (not args.names or m.name in args.names)
              and (not args.tier or any(t.startswith(f"tests/{args.tier}/") for t in m.tests))]
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        raise SystemExit(f"unknown mutations: {', '.join(sorted(unknown))} (see --list)")
    if args.list:
        for m in chosen:
            print(f"{m.name} [{m.item}] {m.path}: {m.why}\n    caught by: {' '.join(m.tests)}")
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="delayq-mutations-"))
    print(f"{len(chosen)} mutations, copies and logs in {workdir}")
    results = [check(m, workdir, not args.no_control) for m in chosen]
    print(f"{sum(results)}/{len(results)} caught")
    if all(results) and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
