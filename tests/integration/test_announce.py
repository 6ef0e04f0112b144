"""Wake-ups after the commit, coalesced per window (core/queue/announce.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from delayq_transport import DelayedQueue, Offer
from delayq_transport.core.db import Database
from delayq_transport.core.db.queries import Queries, notify_channel
from delayq_transport.core.queue import Listener, due_ms
from delayq_transport.core.queue.announce import MAX_LISTED, marker_payload
from delayq_transport.core.queue.watermark import LowWatermarks

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
    """The due time a publish stores and announces: rounded up to the millisecond."""
    return due_ms(at)


def test_a_publish_is_announced_once_after_its_commit(database_url: str) -> None:
    notes = Notes(database_url)
    with DelayedQueue(database_url, kind="k") as q:
        at = datetime.now(UTC) + timedelta(seconds=30)
        q.offer("a", b"", at)
        assert notes.until([f"k:{ms(at)}"]) == [f"k:{ms(at)}"]
    notes.conn.close()


def test_a_burst_in_one_window_announces_every_row_once(database_url: str) -> None:
    """The window coalesces commits, not due times: a burst of countdowns inside one window
    is announced with every row's scheduledAt, each once (a consumer sets its timer to each;
    the earliest alone left the later rows to a search seconds away: issue 41)."""
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
        expected = [f"{'a' if i % 2 else 'b'}:{ms(at)}" for i, at in enumerate(ats)]
        expected.append(f"a:{ms(base) - 1000}")
        notes.until(expected)
        q.announcer.announce([("sentinel", 0)])
        q.announcer.flush()
        got = notes.until(["sentinel:0"])
        assert sorted(got[1:-1]) == sorted(expected), got
    notes.conn.close()


def test_past_max_listed_a_batch_ends_with_a_search_marker(database_url: str) -> None:
    """A batch of more distinct due times than one wake-up lists: the first MAX_LISTED one by
    one, then one search marker at the first time left out (bounded notifications)."""
    notes = Notes(database_url)
    with DelayedQueue(database_url, kind="k") as q:
        q.announcer.window_s = 0.0  # the batch's own statement carries its wake-up
        base = datetime.now(UTC) + timedelta(minutes=5)
        ats = [base + timedelta(milliseconds=i) for i in range(MAX_LISTED + 5)]
        q.offer_batch([Offer(f"r{i}", b"", at) for i, at in enumerate(reversed(ats))],
                      chunk_size=len(ats))  # one statement
        marker = marker_payload("k", ms(ats[MAX_LISTED]))
        got = notes.until([marker])
    assert got == [f"k:{ms(at)}" for at in ats[:MAX_LISTED]] + [marker]
    notes.conn.close()


def test_other_writers_inserts_announce_every_row_then_a_marker(database_url: str) -> None:
    """COPY, bulk merges and raw SQL inserts announce through the insert trigger (migration
    14), in the same form as delayq's own batches."""
    notes = Notes(database_url)
    start = ms(datetime.now(UTC) + timedelta(minutes=5))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            'INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",'
            ' "scheduledAtInitially", "createdAt")'
            " SELECT 'raw' || g, 'raw', ''::bytea, %(s)s + g, %(s)s + g, %(s)s"
            " FROM generate_series(0, %(n)s) AS g", {"s": start, "n": MAX_LISTED + 9})
    marker = marker_payload("raw", start + MAX_LISTED)
    got = notes.until([marker])
    assert got == [f"raw:{start + i}" for i in range(MAX_LISTED)] + [marker]
    trigger = Queries("delayed_queue")["notify_function_complete"]
    assert f"d.n > {MAX_LISTED} " in trigger and f"d.n <= {MAX_LISTED + 1};" in trigger
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


PRODUCER = """
import random, sys
from datetime import datetime, timedelta, timezone
from delayq_transport import DelayedQueue, Offer
url, seed, base_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
def at(ms):
    return datetime.fromtimestamp(ms / 1000, timezone.utc)
with DelayedQueue(url, kind="burst") as q:  # the default window: the real coalescing
    other = q.with_kind("elsewhere")
    for i in range(300):  # one by one, as fast as it goes, random delays over 20 s
        q.offer(f"{seed}-one-{i}", b"", at(base_ms + rng.randrange(20_000)))
        if i % 50 == 0:
            other.offer(f"{seed}-other-{i}", b"", at(base_ms + rng.randrange(20_000)))
    # a batch of more distinct times than one wake-up lists, and a small one
    q.offer_batch([Offer(f"{seed}-batch-{i}", b"", at(base_ms + rng.randrange(20_000)))
                   for i in range(1_300)], chunk_size=2_000)
    q.offer_batch([Offer(f"{seed}-small-{i}", b"", at(base_ms + rng.randrange(20_000)))
                   for i in range(40)])
"""


def test_every_announced_due_time_is_reached_without_a_periodic_search(
        database_url: str) -> None:
    """The mechanism behind 'every countdown on time' (issue 41): a consumer knows every due
    time its producers committed, whatever the publish pattern (bursts from several
    processes, single offers inside one wake-up window, batches past MAX_LISTED, another
    writer's raw insert), without the periodic next-due search: here that search is an hour
    apart, and the consumer's clock (injected) jumps from one reported due time to the next.
    Every row must be taken by the poll at exactly its scheduledAt. With wake-ups that carried
    only the earliest time per window, rows were reported an hour late."""
    base_ms = ms(datetime.now(UTC)) + 3_600_000  # never due on the real clock meanwhile
    clock_ms = [base_ms - 1_000]
    consumer = DelayedQueue(database_url, kind="burst", low_watermark=True,
                            clock=lambda: datetime.fromtimestamp(clock_ms[0] / 1000, UTC))
    consumer.watermarks = LowWatermarks(consumer._probe_below, 3600.0,
                                        next_search_interval_s=3600.0)
    listener = Listener(consumer.db, consumer.queries)
    assert consumer.poll(1000) == ([], None), "the first poll searches: nothing yet"

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    producers = [subprocess.Popen([sys.executable, "-c", PRODUCER, database_url, str(seed),
                                   str(base_ms)], env=env) for seed in (1, 2, 3)]
    with psycopg.connect(database_url, autocommit=True) as conn:  # another writer
        conn.execute(
            'INSERT INTO delayed_queue ("pKey", "pKind", "payload", "scheduledAt",'
            ' "scheduledAtInitially", "createdAt")'
            " SELECT 'raw' || g, 'burst', ''::bytea, %(s)s + g * 13, %(s)s + g * 13, %(s)s"
            " FROM generate_series(0, 1199) AS g", {"s": base_ms})
        assert all(p.wait(timeout=120) == 0 for p in producers)
        conn.execute("SELECT pg_notify(%s, 'sentinel:0')", (notify_channel("delayed_queue"),))
    seen = 0
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:  # every wake-up, up to the sentinel sent after them
        listener.wait(0.5)
        notes = listener.drain()
        for kind, at in notes:
            consumer.lower_watermark(kind, at)
        seen += len(notes)
        if ("sentinel", 0) in notes:
            break
    else:
        raise AssertionError(f"no sentinel after {seen} notifications")
    listener.close()

    with psycopg.connect(database_url) as conn:
        due = dict(conn.execute('SELECT "pKey", "scheduledAt" FROM delayed_queue'
                                " WHERE \"pKind\" = 'burst'").fetchall())
    assert len(due) == 3 * (300 + 1_300 + 40) + 1_200
    taken_at: dict[str, int] = {}
    polls = 0
    next_due: int | None = base_ms - 1_000
    while next_due is not None and polls < 20_000:
        clock_ms[0] = max(clock_ms[0], next_due)  # sleep until the reported time, exactly
        envelopes, next_due = consumer.poll(1000)
        polls += 1
        for e in envelopes:
            assert e.key not in taken_at, "acked: never delivered twice"
            taken_at[e.key] = clock_ms[0]
        if envelopes:
            consumer.ack_many(envelopes)
    consumer.close()
    late = {k: taken_at.get(k, -1) - at for k, at in due.items() if taken_at.get(k) != at}
    assert not late, f"{len(late)} of {len(due)} rows not taken at their due time: " \
        f"{sorted(late.items())[:5]}"
    assert polls <= len(set(due.values())) + 3 * 2 * 300 + 50, polls
