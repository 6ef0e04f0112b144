"""The consumer session's own logic (core/queue/session.py) without PostgreSQL: pacing, the leases
it holds, ack batching, the misfire drop, wake-ups and its stop, against an in-memory queue.

:class:`MemoryQueue` implements the few queue methods the session calls (a stand-in the issue
asks for: the session's decisions are tested here, the statements in the integration and
acceptance tests, which run the same session on PostgreSQL)."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from delayq_transport.core import DatabaseUnavailable, ListenUndeliverable
from delayq_transport.core.queue import Envelope, Listener
from delayq_transport.core.queue.announce import MARKER_PREFIX
from delayq_transport.core.queue.controls import CONTROL_NOTE
from delayq_transport.core.queue.pacing import SKEW_RETRY_S, Subscription, refill
from delayq_transport.core.queue.session import Session

#: Bounded waits on events; a test that gets there has failed.
EVENT_WAIT_S = 5.0


class MemoryQueue:
    """Rows in a dict: (kind, due ms, lock or None, payload) by id; poll takes due rows of the
    kinds in the order given, under one lock, and reports the earliest due row left."""

    lease_ms = 30_000

    def __init__(self) -> None:
        self.rows: dict[int, list[Any]] = {}
        self._ids = itertools.count(1)
        self.polls: list[tuple[int, list[str]]] = []
        self.ack_calls: list[list[tuple[int, str]]] = []
        self.extended: list[set[str]] = []
        self.lowered: list[tuple[str, int]] = []
        self.resets = 0
        self.disabled = False
        self.fail = False
        self.controls_heard: list[bool | None] = []
        self.limited: set[str] = set()
        self.woken_claimers: list[list[str]] = []

    def add(self, kind: str, due_ms: int = 0, payload: bytes = b"m") -> int:
        row_id = next(self._ids)
        self.rows[row_id] = [kind, due_ms, None, payload]
        return row_id

    def poll(self, n: int, kinds: Sequence[str] | None = None
             ) -> tuple[list[Envelope], int | None]:
        if self.fail:
            raise DatabaseUnavailable("down")
        kinds = list(kinds or ())
        self.polls.append((n, kinds))
        now, lock = int(time.time() * 1000), f"lock{len(self.polls)}"
        free = sorted((kinds.index(r[0]), r[1], i) for i, r in self.rows.items()
                      if r[0] in kinds and r[2] is None)
        taken = [i for _, due, i in free if due <= now][:n]
        for i in taken:
            self.rows[i][2] = lock
        left = [due for _, due, i in free if i not in taken]
        envs = [Envelope(i, f"k{i}", self.rows[i][0], self.rows[i][3], self.rows[i][1],
                         self.rows[i][1], 0, lock, False, lambda e: 0) for i in taken]
        return envs, min(left) if left else None

    def _matching(self, deliveries: Iterable[Any]) -> list[int]:
        pairs = [(d.id, d.lock) if isinstance(d, Envelope) else d for d in deliveries]
        return [i for i, lock in pairs if i in self.rows and self.rows[i][2] == lock]

    def ack_many(self, deliveries: Iterable[Any]) -> int:
        if self.fail:
            raise DatabaseUnavailable("down")
        deliveries = list(deliveries)
        self.ack_calls.append([(d.id, d.lock) if isinstance(d, Envelope) else d
                               for d in deliveries])
        gone = self._matching(deliveries)
        for i in gone:
            del self.rows[i]
        return len(gone)

    def release(self, deliveries: Iterable[Any], delay: float = 0) -> int:
        back = self._matching(deliveries)
        for i in back:
            self.rows[i][2] = None
        return len(back)

    def extend_lease(self, locks: Iterable[str]) -> int:
        self.extended.append(set(locks))
        return len(self.extended[-1])

    def lower_watermark(self, kind: str, at_ms: int) -> None:
        self.lowered.append((kind, at_ms))

    def reset_watermarks(self) -> None:
        self.resets += 1

    def disable_watermarks(self) -> None:
        self.disabled = True

    def controls_changed(self, heard: bool | None = None) -> None:
        self.controls_heard.append(heard)

    def controlled(self, kinds: Iterable[str]) -> list[str]:
        return [k for k in kinds if k in self.limited]

    def wake_claimers(self, kinds: Iterable[str]) -> None:
        self.woken_claimers.append(sorted(kinds))


def session_of(queue: MemoryQueue, **options: Any) -> Session:
    """A session whose thread has made its first pass (its timers then start from now): the
    ack flush and lease extension run when a test calls them, not behind its back."""
    first_pass = threading.Event()
    options.setdefault("ack_flush_interval", 3600.0)
    session = Session(queue, listen=options.pop("listen", None), polling_interval=3600.0,
                      unheard_polling_interval=0.5, jobs=[(3600.0, first_pass.set)], **options)
    session.start()
    assert first_pass.wait(EVENT_WAIT_S), "the session's thread never ran"
    return session


def taken(queue: MemoryQueue, session: Session, rows: int, window: int
          ) -> tuple[Subscription, list[Envelope]]:
    """``rows`` due rows of kind ``a``, a subscription of ``window``, and its first poll."""
    for _ in range(rows):
        queue.add("a")
    sub = session.subscribe(["a"], window=window)
    return sub, session.poll(sub)


@pytest.fixture
def queue() -> MemoryQueue:
    return MemoryQueue()


@pytest.fixture
def session(queue: MemoryQueue) -> Any:
    s = session_of(queue, batch_size=100)
    yield s
    s.close()


# -- pacing ---------------------------------------------------------------------------------


def test_a_full_poll_leaves_a_backlog_that_waits_for_half_the_window(
        queue: MemoryQueue, session: Session) -> None:
    sub, first = taken(queue, session, 20, 8)
    assert len(first) == 8 and sub.backlog, "a full batch: more is due already"
    assert session.poll(sub) == [], "no room"
    session.ack(sub, first[:3])
    sub.notify(True, None)  # a wake-up does not override the refill
    assert sub.want(100) == 0, "3 free of 8: below half the window"
    session.ack(sub, first[3:4])
    assert sub.want(100) == refill(8) == 4, "half the window free: one poll takes a batch"
    assert len(session.poll(sub)) == 4


def test_an_idle_subscription_polls_at_once_on_a_wakeup_and_not_without_one(
        queue: MemoryQueue, session: Session) -> None:
    sub = session.subscribe(["a"], window=10)
    assert session.poll(sub) == [] and not sub.backlog  # start-up poll: nothing
    queue.add("a")
    assert sub.want(100) == 0, "nothing woke it: the fallback poll is an hour away"
    session.dispatch([("a", 0)])  # a NOTIFY of a due row
    assert len(session.poll(sub)) == 1
    assert queue.polls[-1] == (10, ["a"]), "the poll asks for the room, no more"


def test_a_due_time_arms_the_wait_and_a_time_already_past_is_retried_after_the_skew(
        queue: MemoryQueue, session: Session) -> None:
    sub = session.subscribe(["a"], window=10)
    session.poll(sub)
    now_ms = time.time() * 1000
    sub.notify(False, int(now_ms + 60_000))
    assert 59 < sub.wait_s(now_ms) <= 60, "wakes at the due time"
    assert sub.want(100, now_ms) == 0 and sub.want(100, now_ms + 60_000) == 10
    sub.polled(False, int(now_ms - 1_000))  # the database says due, the host's clock not yet
    assert sub.next_due_ms is not None and sub.next_due_ms >= now_ms
    assert sub.wait_s() <= SKEW_RETRY_S, "looked at again after the skew, not the fallback"


def test_kinds_are_polled_in_the_order_given(queue: MemoryQueue, session: Session) -> None:
    queue.add("low")
    queue.add("high")
    sub = session.subscribe(["high", "low"], window=1)
    assert [e.kind for e in session.poll(sub)] == ["high"]


# -- leases ---------------------------------------------------------------------------------


def test_what_is_held_is_extended_until_settled_and_settling_twice_is_a_no_op(
        queue: MemoryQueue, session: Session) -> None:
    sub, envs = taken(queue, session, 3, 10)
    assert set(sub.held) == {(e.id, e.lock) for e in envs}
    session.extend_leases()
    assert queue.extended[-1] == {envs[0].lock}, "one lock per poll"
    session.ack(sub, envs[:1])
    session.ack(sub, envs[:1])
    assert session.release(sub, envs[1:2]) == 1
    assert session.release(sub, envs[1:2]) == 0, "released already"
    assert list(sub.held) == [(envs[2].id, envs[2].lock)]
    assert queue.rows[envs[1].id][2] is None, "due again, in place"
    session.flush()
    assert queue.ack_calls == [[(envs[0].id, envs[0].lock)]], "acked once"
    session.unsubscribe(sub)
    assert queue.rows[envs[2].id][2] is None and sub.held == {}, "given back on close"


def test_freed_room_wakes_the_waiter_only_when_it_is_what_it_waits_for(
        queue: MemoryQueue, session: Session) -> None:
    for _ in range(8):
        queue.add("a")
    signals: list[int] = []
    sub: Subscription = session.subscribe(["a"], window=8,
                                          signal=lambda: signals.append(len(sub.held)))
    envs = session.poll(sub)
    signals.clear()
    for env in envs[:5]:
        session.ack(sub, [env])
    assert signals == [7, 4], "the first slot of a full window, then the refill (half)"


# -- ack batching ---------------------------------------------------------------------------


def test_acks_wait_for_the_flush_or_a_full_batch_and_survive_a_failed_flush(
        queue: MemoryQueue) -> None:
    session = session_of(queue, batch_size=4)
    try:
        sub, envs = taken(queue, session, 6, 10)
        envs += session.poll(sub)  # a batch is at most batch_size: the backlog's next poll
        assert len(envs) == 6
        session.ack(sub, envs[:3])
        assert queue.ack_calls == [], "batched: nothing deleted yet"
        session.ack(sub, envs[3:4])
        assert [len(c) for c in queue.ack_calls] == [4], "a full batch is deleted at once"
        session.ack(sub, envs[4:])
        queue.fail = True
        with pytest.raises(DatabaseUnavailable):
            session.flush()
        queue.fail = False
        session.flush()
        assert [len(c) for c in queue.ack_calls] == [4, 2], "kept for the next flush"
        assert queue.rows == {}
    finally:
        session.close()


def test_the_sessions_thread_flushes_acks_on_its_interval(queue: MemoryQueue) -> None:
    session = session_of(queue, ack_flush_interval=0.01)
    try:
        sub, [env] = taken(queue, session, 1, 10)
        flushed = threading.Event()
        ack_many = queue.ack_many

        def recording(deliveries: Iterable[Any]) -> int:
            done = ack_many(deliveries)
            flushed.set()
            return done

        queue.ack_many = recording  # type: ignore[method-assign]
        session.ack(sub, [env])
        assert flushed.wait(EVENT_WAIT_S)
        assert queue.rows == {}
    finally:
        session.close()


# -- the misfire drop and rows not kept -------------------------------------------------------


def test_misfired_rows_are_acked_at_the_poll_and_never_delivered(queue: MemoryQueue) -> None:
    late = queue.add("a", payload=b"misfired")
    kept = queue.add("a")
    session = session_of(queue, misfired=lambda envs: [e for e in envs
                                                       if e.payload == b"misfired"])
    try:
        sub = session.subscribe(["a"], window=10)
        assert [e.id for e in session.poll(sub)] == [kept]
        assert late not in queue.rows and list(sub.held) == [(kept, "lock1")]
    finally:
        session.close()


def test_rows_a_subscription_does_not_keep_are_delivered_and_deleted(
        queue: MemoryQueue, session: Session) -> None:
    gone, held = queue.add("no-ack"), queue.add("a")
    sub = session.subscribe(["no-ack", "a"], keep=lambda e: e.kind == "a")
    assert {e.id for e in session.poll(sub)} == {gone, held}
    assert set(queue.rows) == {held} and list(sub.held) == [(held, "lock1")]


# -- wake-ups ---------------------------------------------------------------------------------


def test_every_note_lowers_the_watermark_and_wakes_only_the_subscriptions_of_its_kind(
        queue: MemoryQueue, session: Session) -> None:
    a = session.subscribe(["a"], window=1)
    b = session.subscribe(["b"], window=1)
    session.poll(a)
    session.poll(b)
    later = int(time.time() * 1000) + 60_000
    notes = [(MARKER_PREFIX + "a", later), ("a", later), ("a", 1)]
    session.dispatch(notes)
    assert queue.lowered == notes, "search markers too, as they came"
    assert a.wanted and a.next_due_ms == later
    assert not b.wanted and b.next_due_ms is None


def test_a_kind_added_to_an_idle_subscription_polls_at_once_and_wakes_its_waiter(
        queue: MemoryQueue, session: Session) -> None:
    """Rows of the added kind were announced before it consumed them: nothing else would poll
    before the fallback (an hour here). A kind taken away wakes no one."""
    woken = threading.Event()
    sub = session.subscribe(["a"], window=10, signal=woken.set)
    session.poll(sub)
    waiting = queue.add("b")
    woken.clear()
    sub.set_kinds(["a"])
    assert sub.want(100) == 0 and not woken.is_set(), "nothing added: nothing to poll"
    sub.set_kinds(["a", "b"])
    assert woken.is_set(), "a thread waiting on the subscription was not woken"
    assert [e.id for e in session.poll(sub)] == [waiting]
    woken.clear()
    sub.set_kinds(["b"])
    assert sub.want(100) == 0 and not woken.is_set()


class SilentListener:
    """A LISTEN connection on which nothing arrives (a socket pair's quiet end)."""

    def __init__(self) -> None:
        self._pair = socket.socketpair()
        self.fd = self._pair[0].fileno()
        self.closed = False

    def drain(self) -> list[tuple[str, int]]:
        return []

    def close(self) -> None:
        self.closed = True
        for sock in self._pair:
            sock.close()


def test_a_new_listen_connection_makes_everyone_poll_from_the_bottom(
        queue: MemoryQueue) -> None:
    """What was published before it listened was not heard (a consumer thread may have polled
    first): every subscription polls, and the watermarks start from the bottom."""
    session = session_of(queue, listen=SilentListener)
    try:
        sub = session.subscribe(["a"], window=1)
        session.poll(sub)
        assert not sub.wanted
        resets = queue.resets
        session.listening()
        assert isinstance(session.listener, SilentListener)
        assert sub.wanted and queue.resets == resets + 1
        assert queue.controls_heard[-1] is True  # changes made meanwhile are read
    finally:
        session.close()


def test_a_control_change_rereads_the_controls_and_wakes_everyone(queue: MemoryQueue) -> None:
    """A queue paused, resumed or limited (core/queue/controls.py) sends a marker wake-up: the
    controls are read at the next poll and every subscription polls (a resume claims at
    once); the marker is no kind's due time."""
    session = session_of(queue)
    try:
        sub = session.subscribe(["a"], window=1)
        session.poll(sub)
        assert not sub.wanted
        session.dispatch([(CONTROL_NOTE, 0)])
        assert sub.wanted and queue.controls_heard[-1] is None and queue.lowered == []
    finally:
        session.close()


def test_listen_that_cannot_deliver_polls_on_the_short_interval(queue: MemoryQueue) -> None:
    def undeliverable() -> Listener:
        raise ListenUndeliverable("behind a transaction pooler", expected=True)

    session = session_of(queue, listen=undeliverable)
    try:
        session.listening()
        assert session.unheard and queue.disabled
        assert queue.controls_heard[-1] is False  # read every second instead
        assert session.polling_interval == 0.5
    finally:
        session.close()


def test_an_ack_that_frees_a_concurrency_slot_is_deleted_at_once_and_wakes_the_claimers(
        queue: MemoryQueue) -> None:
    """Other acks wait for the batch (an hour here); one that a concurrency limit counts is
    flushed at once by the session's thread, which then wakes every consumer of its kind
    (core/queue/controls.py)."""
    queue.limited = {"a"}
    for kind in ("a", "b"):
        queue.add(kind)
    session = session_of(queue)
    try:
        sub = session.subscribe(["a", "b"], window=2)
        by_kind = {e.kind: e for e in session.poll(sub)}
        session.ack(sub, [by_kind["b"]])
        session.ack(sub, [by_kind["a"]])  # the session's thread flushes both, then wakes
        deadline = time.monotonic() + 10
        while not queue.woken_claimers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queue.woken_claimers == [["a"]] and len(queue.ack_calls) == 1
        assert sorted(queue.ack_calls[0]) == sorted([(e.id, e.lock) for e in by_kind.values()])
    finally:
        session.close()


# -- stop -----------------------------------------------------------------------------------


def test_close_wakes_every_wait_at_once(queue: MemoryQueue) -> None:
    """A thread in the blocking face and one waiting on its subscription's event both return
    when the session closes, long before their timeouts (an hour's fallback poll)."""
    session = session_of(queue)
    event = threading.Event()
    sub: Subscription = session.subscribe(["a"], window=1, signal=event.set)
    session.poll(sub)
    event.clear()
    served = threading.Event()

    def serve() -> None:
        with pytest.raises(TimeoutError):
            session.serve(timeout=3600)
        served.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    gone = threading.Event()
    other = session.subscribe(["b"], window=1, signal=gone.set)
    session.poll(other)
    gone.clear()
    session.unsubscribe(other)  # as Dramatiq's broker closes its consumers first
    assert gone.wait(EVENT_WAIT_S), "an unsubscribed waiter was not woken"
    session.close()
    assert event.wait(EVENT_WAIT_S), "the subscription's waiter was not woken"
    assert served.wait(EVENT_WAIT_S), "the blocking wait was not woken"


# -- the collector -------------------------------------------------------------------------


@pytest.mark.parametrize("freeze", [True, False])
def test_a_starting_session_freezes_the_start_up_heap_once_unless_told_not_to(
        freeze: bool) -> None:
    """A fresh interpreter (the freeze is once per process): the first session to start moves
    what is alive to the permanent generation, a second one adds nothing; with
    ``freeze_gc=False`` nothing is frozen. Why it matters shows in bench/run.py's burst
    scenario."""
    code = (
        "import gc, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_session import MemoryQueue, session_of\n"
        "before = gc.get_freeze_count()\n"
        f"first = session_of(MemoryQueue(), freeze_gc={freeze})\n"
        "after_first = gc.get_freeze_count()\n"
        "kept = object(), [object()]  # alive after the first start: a second may not freeze\n"
        f"second = session_of(MemoryQueue(), freeze_gc={freeze})\n"
        "print(before, after_first, gc.get_freeze_count())\n"
        "first.close(); second.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    before, after_first, after_second = map(int, out)
    assert before == 0
    if freeze:
        assert after_first > 1000, "the start-up heap (modules, classes) was not frozen"
        assert after_second == after_first
    else:
        assert after_first == after_second == 0
