"""Spark Python workers started with extra environment, for tests that change what a
partition's interpreter sees (an import that fails, a hook that fails a task)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def worker_env(spark: Any, **env: str) -> Iterator[None]:
    """Python workers started with extra environment (Spark keys its workers on it, so these
    are new processes, and the session's usual workers are untouched)."""
    environment = spark.sparkContext.environment
    saved = {k: environment.get(k) for k in env}
    environment.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                environment.pop(k, None)
            else:
                environment[k] = v
