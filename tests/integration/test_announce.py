"""Wake-ups after the commit, coalesced per window (core/announce.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from delayq_transport import DelayedQueue, Offer
from delayq_transport.core.db import Database
from delayq_transport.core.queries import Queries, notify_channel

WAIT_S = 10.0


class Notes:
    """A LISTENing connection that collects this table's notifications."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(Queries("delayed_queue")["listen"])
        self.seen: list[str] = []

    def until(self, done: list[str]) -> list[str]:
        """Collect until every payload of ``done`` has arrived (bounded)."""
        for note in self.conn.notifies(timeout=WAIT_S):
            assert note.channel == notify_channel("delayed_queue")
            self.seen.append(note.payload)
            if all(p in self.seen for p in done):
                return self.seen
        raise AssertionError(f"waited for {done}, got {self.seen}")


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def test_a_publish_is_announced_once_after_its_commit(database_url: str) -> None:
    notes = Notes(database_url)
    with DelayedQueue(database_url, kind="k") as q:
        at = datetime.now(UTC) + timedelta(seconds=30)
        q.offer("a", b"", at)
        assert notes.until([f"k:{ms(at)}"]) == [f"k:{ms(at)}"]
    notes.conn.close()


def test_a_burst_is_one_notification_per_kind_with_its_earliest_row(database_url: str) -> None:
    """A leading notification at once, then what the window gathered: one per kind, carrying
    the earliest scheduledAt (what a consumer's low watermark needs), however many rows."""
    notes = Notes(database_url)
    with DelayedQueue(database_url, kind="a") as q:
        q.announcer.window_s = 1.0  # long enough that the burst lands inside one window
        base = datetime.now(UTC) + timedelta(minutes=5)
        q.offer("lead", b"", base)
        notes.until([f"a:{ms(base)}"])
        b = q.with_kind("b")
        ats = [base + timedelta(seconds=s) for s in range(40, 0, -1)]
        for i, at in enumerate(ats):
            (q if i % 2 else b).offer(f"burst-{i}", b"", at)
        q.offer_batch([Offer("batch", b"", base - timedelta(seconds=1))])
        earliest_b = min(ms(at) for i, at in enumerate(ats) if i % 2 == 0)
        expected = [f"a:{ms(base) - 1000}", f"b:{earliest_b}"]
        got = notes.until(expected)
        q.announcer.announce([("sentinel", 0)])
        q.announcer.flush()
        got = notes.until(["sentinel:0"])
        assert sorted(got[1:-1]) == sorted(expected), got
    notes.conn.close()


def test_pending_wakeups_are_sent_before_the_process_exits(database_url: str) -> None:
    """A script that publishes and exits at once still wakes the consumers at once."""
    notes = Notes(database_url)
    script = textwrap.dedent(f"""
        from datetime import datetime, timezone
        from delayq_transport import DelayedQueue
        q = DelayedQueue({database_url!r}, kind="x")
        q.announcer.window_s = 60.0  # the second one would wait a minute
        q.offer("one", b"", datetime.fromtimestamp(1000, timezone.utc))
        q.with_kind("y").offer("two", b"", datetime.fromtimestamp(999, timezone.utc))
        # no close(): the interpreter's exit sends what is pending
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, env=env)
    assert sorted(notes.until(["x:1000000", "y:999000"])) == ["x:1000000", "y:999000"]
    notes.conn.close()


def test_the_publish_that_opens_a_window_carries_its_wakeup_in_one_round_trip(
        database_url: str, tmp_path: Path) -> None:
    """No statement of its own for the wake-up: the publish's one statement notifies, in the
    publish's transaction (libpq's protocol trace of the publishing connection shows it)."""
    notes = Notes(database_url)
    with Database(database_url, max_size=1) as db, \
            DelayedQueue(db, kind="k", relaxed_consumer_commits=True) as q:
        q.offer("warm", b"", None, durable=False)  # prepares the statement
        notes.until([f"k:{q.get('warm').scheduled_at_ms}"])
        q.announcer.window_s = 0.0  # every publish opens a window
        conn = db.relaxed_pool.getconn()
        trace = tmp_path / "trace"
        with open(trace, "w") as out:
            conn.pgconn.trace(out.fileno())
            db.relaxed_pool.putconn(conn)
            q.offer("a", b"", None, durable=False)
            conn.pgconn.untrace()
        # PQtrace: [timestamp] direction length message; "F": frontend, what we sent.
        fields = [line.split("\t") for line in trace.read_text().splitlines()]
        sent = [f[f.index("F") + 2].split(" ")[0] for f in fields if "F" in f]
        assert sent.count("Sync") == 1, sent
        assert notes.until([f"k:{q.get('a').scheduled_at_ms}"])
    notes.conn.close()


def test_wakeups_a_publish_carried_come_back_when_it_inserts_nothing(database_url: str) -> None:
    """A publish whose key exists commits no row; the wake-ups pending in this process that it
    was to carry are sent all the same (by the announcer, once its window is over)."""
    notes = Notes(database_url)
    with DelayedQueue(database_url, kind="k") as q:
        q.offer("exists", b"", None)
        notes.until([f"k:{q.get('exists').scheduled_at_ms}"])
        q.announcer.window_s = 60.0
        q.announcer.note([("p", 7)])  # committed earlier, waiting for the window's end
        q.announcer.window_s = 0.0
        q.offer("exists", b"", None, can_update=False)  # carries p:7, inserts nothing
        assert "p:7" in notes.until(["p:7"])
    notes.conn.close()
