"""Fetch Dramatiq's tests from the sdist of the installed version and lay them out to run.

``python run_peer.py DIR`` prints the directory holding ``tests/`` (a package with our
conftest and common module). The sdist is downloaded once into a cache directory
(``DELAYQ_PEER_CACHE``, default ``~/.cache/delayq-dramatiq-peer``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).parent
PEER_FILES = ("test_actors.py", "test_composition.py", "test_callbacks.py",
              "test_generic_actors.py", "test_messages.py", "test_worker.py", "test_results.py")


def sdist(cache: Path) -> Path:
    ver = version("dramatiq")
    target = cache / f"dramatiq-{ver}.tar.gz"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", f"dramatiq=={ver}", "-d", str(cache)], check=True,
                       stdout=subprocess.DEVNULL)
    return target


def lay_out(dest: Path, cache: Path) -> Path:
    """``dest/tests``: the peer files, ``__init__.py``, our conftest.py and common.py, and
    the tests adapted from deselected ones (test_delayq_adapted.py)."""
    tests = dest / "tests"
    shutil.rmtree(tests, ignore_errors=True)
    tests.mkdir(parents=True)
    with tarfile.open(sdist(cache)) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[1] == "tests" and parts[2] in PEER_FILES:
                data = tar.extractfile(member)
                assert data is not None
                (tests / parts[2]).write_bytes(data.read())
    missing = [f for f in PEER_FILES if not (tests / f).exists()]
    if missing:
        raise SystemExit(f"sdist lacks {missing}")
    (tests / "__init__.py").write_text("")
    shutil.copy(HERE / "peer_conftest.py", tests / "conftest.py")
    shutil.copy(HERE / "peer_common.py", tests / "common.py")
    shutil.copy(HERE / "peer_adapted.py", tests / "test_delayq_adapted.py")
    return dest


def default_cache() -> Path:
    return Path(os.environ.get("DELAYQ_PEER_CACHE",
                               Path.home() / ".cache" / "delayq-dramatiq-peer"))


if __name__ == "__main__":
    print(lay_out(Path(sys.argv[1]), default_cache()))
