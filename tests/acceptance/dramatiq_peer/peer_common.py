"""common.py of Dramatiq's own tests run against delayq (copied in as common.py).

Only what the selected test files import: ``worker`` and ``skip_on_pypy``.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from dramatiq import Worker

skip_on_pypy = pytest.mark.skipif(platform.python_implementation() == "PyPy",
                                  reason="not supported on PyPy")


@contextmanager
def worker(*args: Any, **kwargs: Any) -> Iterator[Worker]:
    """A started Worker, stopped on exit."""
    w = Worker(*args, **kwargs)
    try:
        w.start()
        yield w
    finally:
        w.stop()
