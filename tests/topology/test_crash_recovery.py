"""What a crash of PostgreSQL does to consumer commits that did not wait for the WAL flush
(issue 27, item 3).

Messages are published durably (``durable=True``: the commit waits for the flush), then
acquired, some leases extended, some released, most acked, all on the relaxed pool the adapters
consume with (``synchronous_commit=off``). The server then stops the way a crash does: an
immediate shutdown (SIGQUIT to the postmaster: no checkpoint, no WAL written on the way out,
crash recovery at the next start). The WAL writer is slowed to its longest delay so the last
relaxed commits are still in PostgreSQL's own memory when it goes, as they would be in the
~0.6 s window of a real crash. After the restart: every durably published message is still
there or was acked; the acks the crash lost are there again and are delivered again, once,
counted; nothing else is delivered, and nothing twice.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from delayq_transport.core.queue import DelayedQueue, StoredMessage, dead_letters

from .clusters import Cluster, wait_for

pytestmark = pytest.mark.timeout(120)

PUBLISHED, ACQUIRED, POLL = 150, 120, 10
#: The lease of the test's queue: rows leased before the crash come back after it.
LEASE_S = 1.0
#: Nothing but the test writes WAL out early: the WAL writer wakes every 10 s at most (a full
#: page still wakes it), the background writer writes no dirty buffers (writing one flushes WAL
#: up to its LSN first), no autovacuum.
SETTINGS = {"wal_writer_delay": "'10s'", "bgwriter_lru_maxpages": "0", "autovacuum": "off"}


def _crash(server: Cluster) -> None:
    """Immediate shutdown, signalled directly (pg_ctl would add ~100 ms of walwriter time)."""
    pid = server.postmaster_pid()
    assert pid is not None
    os.kill(pid, signal.SIGQUIT)
    wait_for(lambda: not _alive(pid), "the postmaster to exit")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_crash_loses_relaxed_acks_as_redeliveries_only(scratch: Path) -> None:
    server = Cluster.create(scratch, "crash", SETTINGS)
    try:
        server.start()
        _run(server)
    finally:
        server.destroy()


def _run(server: Cluster) -> None:
    url = server.url()  # the cluster is the test's own: its postgres database will do
    published = {f"k{i}" for i in range(PUBLISHED)}
    with DelayedQueue(url, kind="k", acquire_timeout=LEASE_S,
                      relaxed_consumer_commits=True) as q:
        for key in sorted(published):
            q.offer(key, b"m", durable=True)
        polls = [q.try_poll_many(POLL) for _ in range(ACQUIRED // POLL)]
        held = [e for poll in polls for e in poll]
        assert len(held) == ACQUIRED
        assert q.extend_lease([polls[0][0].lock]) == POLL  # kept past the lease, then acked
        released = {e.key for e in polls[1]}
        assert q.release(polls[1]) == POLL
        leased = {e.key for e in polls[2]}  # never acked: a lease that runs out
        acked: set[str] = set()
        for poll in polls[3:]:
            assert q.ack_many(poll) == POLL
            acked |= {e.key for e in poll}
        assert q.ack_many(polls[0]) == POLL
        acked |= {e.key for e in polls[0]}
        _crash(server)
    server.start()
    with DelayedQueue(url, kind="k", acquire_timeout=LEASE_S, ensure_schema=False,
                      relaxed_consumer_commits=True) as q:
        stored = [row.key for row in _rows(q)]
        assert len(stored) == len(set(stored)), "a row was duplicated"
        present = set(stored)
        assert published - acked <= present, f"lost: {sorted(published - acked - present)}"
        assert present <= published
        lost_acks = acked & present
        # The last acks were in PostgreSQL's memory only: some must be lost, or the consumer
        # statements waited for the flush after all.
        assert lost_acks, "no relaxed ack was lost: were they committed durably?"
        delivered = _drain(q, len(present))
    assert sorted(delivered) == sorted(present), "each row still there is delivered once"
    redelivered = set(delivered) & (acked | leased | released)
    assert redelivered == lost_acks | leased | released
    print(f"lost acks redelivered: {len(lost_acks)} of {len(acked)}; leased {len(leased)}, "
          f"released {len(released)}, never delivered {len(present - redelivered)}")


def _rows(q: DelayedQueue) -> list[StoredMessage]:
    """Every row of the kind, read once after recovery."""
    return dead_letters.list_kinds(q, ["k"], limit=10 * PUBLISHED)


def _drain(q: DelayedQueue, expected: int) -> list[str]:
    """Acquire and ack until ``expected`` deliveries were seen (leases lapse within LEASE_S)."""
    delivered: list[str] = []

    def step() -> bool:
        got = q.try_poll_many(50)
        delivered.extend(e.key for e in got)
        if got:
            q.ack_many(got)
        return len(delivered) >= expected

    wait_for(step, f"{expected} deliveries after the restart", timeout=LEASE_S + 20)
    assert not q.try_poll_many(50), "a delivery beyond the rows left"
    return delivered
