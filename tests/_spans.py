"""What ran at once, from the spans tasks record on the database clock (a ``spans`` table:
started_ms, ended_ms; tests/acceptance/test_limits.py, tests/djtasks/test_limits.py), sampled
every 10 ms as the tasks' own record of themselves."""

from __future__ import annotations

from typing import Any

import psycopg

SAMPLE_MS = 10

SPANS_DDL = """CREATE TABLE IF NOT EXISTS spans (
    id BIGSERIAL PRIMARY KEY, task_id TEXT, pid INT, ended_ms BIGINT,
    started_ms BIGINT DEFAULT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)"""


def spans(url: str) -> list[tuple[str, int, int | None]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT task_id, started_ms, ended_ms FROM spans ORDER BY started_ms")
        return [(str(r[0]), int(r[1]), None if r[2] is None else int(r[2])) for r in rows]


def running_samples(found: list[tuple[Any, int, int | None]], until_ms: int | None = None
                    ) -> list[tuple[int, int]]:
    """(time, tasks running) every SAMPLE_MS from the first start; a span never ended (its
    worker was killed) runs until ``until_ms``."""
    if not found:
        return []
    end_default = until_ms if until_ms is not None else max(
        (e for _, _, e in found if e is not None), default=0)
    intervals = [(s, e if e is not None else end_default) for _, s, e in found]
    first, last = min(s for s, _ in intervals), max(e for _, e in intervals)
    return [(t, sum(1 for s, e in intervals if s <= t < e))
            for t in range(first, last, SAMPLE_MS)]


def share_at(samples: list[tuple[int, int]], level: int, until_ms: int) -> float:
    """The share of samples before ``until_ms`` with exactly ``level`` running."""
    before = [n for t, n in samples if t < until_ms]
    return sum(1 for n in before if n == level) / max(len(before), 1)
