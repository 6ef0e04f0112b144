"""Operators see trouble coming (issue 10, part 5): ``delayq status`` (table and ``--json``) and
the Prometheus metrics name what holds back cleanup (pid, application, age), count dead tuples,
and warn by the documented thresholds; the metrics endpoint is scraped over real HTTP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from delayq_transport import DelayedQueue
from delayq_transport.cli import main
from delayq_transport.core.inspect import health as h
from delayq_transport.metrics import METRICS, serve_metrics

ROOT = Path(__file__).resolve().parents[2]
HOLDER_APP = "delayq-test-holder"


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0,
               message: str = "condition") -> Any:
    """Bounded wait on an observable condition (statistics reach pg_stat_* asynchronously)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@pytest.fixture
def holder(database_url: str) -> Iterator[psycopg.Connection]:
    """A session idle in a REPEATABLE READ transaction: what a forgotten report looks like."""
    conn = psycopg.connect(database_url, application_name=HOLDER_APP)
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT count(*) FROM delayed_queue")
    yield conn
    conn.rollback()
    conn.close()


def _blocker(doc: dict, pid: int) -> dict:
    found = [b for b in doc["health"]["blockers"] if b["pid"] == pid]
    assert found, doc["health"]["blockers"]
    return found[0]


def test_status_names_the_idle_transaction_and_counts_dead_tuples(
        database_url: str, holder: psycopg.Connection) -> None:
    pid = holder.info.backend_pid
    with DelayedQueue(database_url, kind="celery") as q:
        q.offer_batch([(f"k{i}", b"", None) for i in range(h.DEAD_TUPLES_WARN + 500)])
        while q.ack_many(q.try_poll_many(1000)):
            pass  # every ack leaves a dead tuple the held snapshot keeps from VACUUM
    with psycopg.connect(database_url, autocommit=True) as conn:  # VACUUM: no transaction
        conn.execute("VACUUM delayed_queue")
    run = CliRunner()

    def status_json() -> dict:
        result = run.invoke(main, ["-d", database_url, "status", "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    doc = wait_until(lambda: (d := status_json())["health"]["dead_tuples"]
                     and any(b["pid"] == pid for b in d["health"]["blockers"]) and d,
                     message="dead tuples and the holder in status --json")
    blocker = _blocker(doc, pid)
    assert blocker["source"] == "session" and blocker["application"] == HOLDER_APP
    assert blocker["state"] == "idle in transaction" and blocker["age_s"] >= 1.0
    assert blocker["xmin_age_xids"] >= 1 and doc["health"]["horizon_age_s"] >= 1.0
    assert doc["health"]["dead_tuples"] >= h.DEAD_TUPLES_WARN
    assert any(w["subject"] == "dead tuples" for w in doc["health"]["warnings"])
    table = run.invoke(main, ["-d", database_url, "status"], env={"COLUMNS": "200"})
    assert table.exit_code == 0
    assert str(pid) in table.output and HOLDER_APP in table.output
    assert "warning: dead tuples" in table.output


def test_metrics_endpoint_reports_the_holder_over_http(
        database_url: str, holder: psycopg.Connection) -> None:
    with DelayedQueue(database_url, kind="celery") as q:
        q.offer("ready", b"")
        q.limit("celery", concurrency=3, rate="50/s")  # the queue control series are served
    server = serve_metrics(database_url, port=0)
    try:
        assert server.addr == "127.0.0.1"

        def scrape() -> dict[str, float]:
            with urllib.request.urlopen(server.url, timeout=10) as response:
                text = response.read().decode()
            return {s.name + json.dumps(s.labels, sort_keys=True): s.value
                    for f in text_string_to_metric_families(text) for s in f.samples}

        samples = wait_until(lambda: (s := scrape()) and s[
            'delayq_idle_in_transaction_sessions{"table": "delayed_queue"}'] >= 1 and s,
            message="the idle session in the metrics")
    finally:
        server.close()
    ready = 'delayq_ready_messages{"priority": "0", "queue": "celery", "table": "delayed_queue"}'
    assert samples[ready] == 1.0
    assert samples['delayq_xmin_horizon_age_seconds{"table": "delayed_queue"}'] >= 1.0
    assert samples['delayq_cleanup_blockers{"source": "session", "table": "delayed_queue"}'] >= 1
    assert samples['delayq_up{"table": "delayed_queue"}'] == 1.0
    # Every declared metric (docs/reference/metrics.md is rendered from METRICS) is served,
    # and nothing undeclared is; each sample carries its metric's declared labels.
    names = {key.split("{", 1)[0] for key in samples}
    # no bloat before ANALYZE, no dead letter kept here
    assert names | {"delayq_relation_bloat_ratio", "delayq_dead_letters"} == set(METRICS)
    for key in samples:
        name, labels = key.split("{", 1)
        assert sorted(json.loads("{" + labels)) == sorted(METRICS[name][0]), key


def test_delayq_metrics_serve_command(database_url: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.Popen([sys.executable, "-m", "delayq_transport", "-d", database_url,
                             "metrics", "--serve", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server is up (or the command died)
        assert f"http://127.0.0.1:{port}/metrics" in line, line + proc.stdout.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert 'delayq_up{table="delayed_queue"} 1.0' in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _blocker_of(source: str, **kw: object) -> h.Blocker:
    base = dict(source=source, pid=1, role="r", application="app", database="db",
                state="active", age_s=0.0, xmin_age_xids=10, detail=None)
    base.update(kw)
    return h.Blocker(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("blocker, level", [
    (_blocker_of("session", age_s=h.XMIN_HORIZON_WARN_S + 1), "warning"),
    (_blocker_of("session", age_s=h.XMIN_HORIZON_CRITICAL_S + 1), "critical"),
    (_blocker_of("session", state="idle in transaction", xmin_age_xids=None,
                 age_s=h.IDLE_IN_TRANSACTION_WARN_S + 1), "warning"),
    (_blocker_of("replication_slot", state="inactive", age_s=None, detail="xmin 5"), "critical"),
    (_blocker_of("replication_slot", state="active", age_s=None,
                 xmin_age_xids=h.XMIN_AGE_WARN_XIDS + 1), "warning"),
    (_blocker_of("prepared_transaction", age_s=h.PREPARED_XACT_WARN_S + 1), "critical"),
    (_blocker_of("session", age_s=h.XMIN_HORIZON_WARN_S - 1), None),
])
def test_thresholds(blocker: h.Blocker, level: str | None) -> None:
    warnings = h.assess(h.Health([blocker], 100, 0, None, 1.0, []))
    assert [w.level for w in warnings][:1] == ([level] if level else [])


def test_dead_tuple_and_bloat_thresholds() -> None:
    big = h.Relation("q", "table", h.BLOAT_MIN_BYTES * 2, h.BLOAT_WARN_RATIO + 0.1)
    small = h.Relation("i", "index", h.BLOAT_MIN_BYTES // 2, 0.9)
    subjects = [w.subject for w in h.assess(
        h.Health([], 1000, h.DEAD_TUPLES_WARN + 1, None, 1.0, [big, small]))]
    assert subjects == ["dead tuples", "bloat q"]
    many_live = h.Health([], 10 * h.DEAD_TUPLES_WARN, h.DEAD_TUPLES_WARN + 1, None, 1.0, [])
    assert h.assess(many_live) == [], "dead tuples below the ratio of live rows are normal"


def test_pages_left_half_free_by_the_fillfactor_are_not_bloat(queue: DelayedQueue,
                                                               database_url: str) -> None:
    """Migration 6 fills pages to half on purpose: a table of live rows only is not bloated."""
    queue.offer_batch([(f"k{i}", b"x" * 1000, None) for i in range(600)])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ANALYZE delayed_queue")
    health = h.check_health(queue.db, "delayed_queue")
    [table] = [r for r in health.relations if r.kind == "table"]
    assert table.bloat_ratio is not None and table.bloat_ratio < 0.25, table
