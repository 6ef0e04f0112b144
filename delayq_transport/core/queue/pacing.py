"""One consumer's pacing: when a :class:`Subscription` polls, how much, and what it holds.

The policy every front end's consumer follows (see :mod:`.session`): a wake-up or a due time
polls at once; a poll that filled what it asked for leaves a *backlog*, and the next poll then
waits for half the window (:func:`refill`). Its own module because the policy is a pure function
of one subscription's state and the clock: it reads no socket, runs no statement and starts no
thread, so it is tested on its own (tests/unit/test_session.py) and the session only asks it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from .types import Delivery, Envelope

#: A due time that found nothing due (host and database clocks differ slightly) is looked at
#: again this much later.
SKEW_RETRY_S = 0.005


class Owner(Protocol):
    """What a subscription uses of its session (:class:`~.session.Session` has it)."""

    lock: threading.Lock
    polling_interval: float

    def wake(self, subs: Iterable[Subscription] | None = None) -> None: ...


def delivery_key(delivery: Delivery) -> tuple[int, str]:
    """What a held delivery is known by: its (id, lock)."""
    return (delivery.id, delivery.lock) if isinstance(delivery, Envelope) else delivery


class Subscription:
    """One consumer of a session: the kinds it polls, its window, its pacing, what it holds.

    ``capacity`` returns (room, window): how many more deliveries it may take now (None: no
    limit) and its whole window (None: none); by default the window is ``window`` and the
    room what is not held. ``signal`` wakes whoever waits for it (a thread's event) when a
    wake-up, a due time or freed room concerns it. ``deliver`` hands over rows polled on the
    session's behalf (the event-loop face). ``order`` gives the kinds in the order of the next
    poll (default: ``kinds`` as given, highest priority first); ``keep`` says whether a
    delivery stays held until settled (default: all; the others are deleted at the poll:
    delivered means gone).
    """

    def __init__(self, session: Owner, kinds: Iterable[str], *, window: int | None = None,
                 capacity: Callable[[], tuple[int | None, int | None]] | None = None,
                 signal: Callable[[], None] | None = None,
                 deliver: Callable[[Subscription, list[Envelope]], Any] | None = None,
                 order: Callable[[], list[str]] | None = None,
                 keep: Callable[[Envelope], bool] | None = None) -> None:
        self.session = session
        ordered = list(dict.fromkeys(kinds))
        self.kinds = set(ordered)
        self.window = window
        self._capacity = capacity
        self.signal = signal
        self.deliver = deliver
        self._order = order if order is not None else ordered.copy
        self._given_order = order is not None
        self.keep = keep
        #: Poll at the next chance (start-up, a wake-up, an error, notifications lost).
        self.wanted = True
        #: The last poll filled what it asked for: more is due already.
        self.backlog = False
        #: Earliest known due time (epoch ms) of its kinds; None: none known.
        self.next_due_ms: int | None = None
        self.last_poll = 0.0
        self.closed = False
        self.held: dict[tuple[int, str], Envelope] = {}

    def set_kinds(self, kinds: Iterable[str]) -> None:
        """Consume these kinds from now on (a queue added or cancelled at run time). An added
        kind's rows may be waiting already, their NOTIFY gone to no one: it polls at the next
        chance, not at the fallback poll."""
        ordered = list(dict.fromkeys(kinds))
        added = not self.kinds.issuperset(ordered)
        self.kinds = set(ordered)
        if not self._given_order:
            self._order = ordered.copy
        if added:
            self.session.wake([self])

    def order(self) -> list[str]:
        return self._order()

    def capacity(self) -> tuple[int | None, int | None]:
        if self._capacity is not None:
            return self._capacity()
        if self.window is None:
            return None, None
        return self.window - len(self.held), self.window

    # -- the pacing policy -----------------------------------------------------------------

    def want(self, batch_size: int, now_ms: float | None = None) -> int:
        """How many rows to poll now; 0: not now (see the module docstring)."""
        if self.closed or not self.kinds:
            return 0
        due = self.next_due_ms
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        if not (self.wanted or self.backlog or (due is not None and due <= now_ms)
                or time.monotonic() - self.last_poll >= self.session.polling_interval):
            return 0
        room, window = self.capacity()
        if room is not None and (room <= 0 or self.backlog and window and room < refill(window)):
            return 0
        return batch_size if room is None else min(room, batch_size)

    def wait_s(self, now_ms: float | None = None) -> float:
        """Seconds until it polls without being woken: fallback or due time (skew floor)."""
        wait = self.session.polling_interval - (time.monotonic() - self.last_poll)
        room, _ = self.capacity()
        due = self.next_due_ms
        full = room is not None and room <= 0
        if due is not None and not full:
            now_ms = time.time() * 1000 if now_ms is None else now_ms
            wait = min(wait, max((due - now_ms) / 1000, SKEW_RETRY_S))
        if full and self.signal is None:  # nothing tells it of freed room: look again soon
            wait = min(wait, SKEW_RETRY_S * 10)
        return max(wait, 0.0)

    def polled(self, more: bool, next_due: int | None, error: Exception | None = None) -> None:
        """Learn from a poll: a full batch (``more``) leaves a backlog; an error polls again;
        the next due time arms the timer (one already past is retried after SKEW_RETRY_S)."""
        self.backlog = more and error is None
        if error is not None:
            self.wanted = True
        floor = int((time.time() + SKEW_RETRY_S) * 1000)
        self.next_due_ms = None if next_due is None else max(next_due, floor)

    def notify(self, now_at: bool, later_ms: int | None) -> bool:
        """A wake-up of its kinds: ``now_at`` a row is due now, ``later_ms`` one due later.
        Only a change wakes the waiter: a stream of sends does not wake it once each. True if
        its due time moved earlier (the loop's timer is armed again)."""
        woken = earlier = False
        if now_at and not self.wanted:
            self.wanted = woken = True
        if later_ms is not None and (self.next_due_ms is None or later_ms < self.next_due_ms):
            self.next_due_ms, earlier = later_ms, True
        if (woken or earlier) and self.signal is not None:
            self.signal()
        return earlier

    # -- leases ----------------------------------------------------------------------------

    def hold(self, envs: Iterable[Envelope]) -> None:
        with self.session.lock:
            for env in envs:
                self.held[(env.id, env.lock)] = env

    def forget(self, deliveries: Iterable[Delivery], kinds: set[str] | None = None
                ) -> list[tuple[int, str]]:
        """Stop holding these; returns the ones that were held (a second settle is a no-op),
        and adds their kinds to ``kinds``. Wakes the waiter when the freed room is what it
        waits for: the first slot of a full window, or the refill of a backlog (waking on
        every settle cost a thread switch each)."""
        with self.session.lock:
            gone = []
            for key in map(delivery_key, deliveries):
                env = self.held.pop(key, None)
                if env is not None:
                    gone.append(key)
                    if kinds is not None:
                        kinds.add(env.kind)
        if gone and self.signal is not None:
            room, window = self.capacity()
            if room is not None and (room == len(gone) or window and room == refill(window)):
                self.signal()
        return gone

    def locks(self) -> set[str]:
        with self.session.lock:
            return {lock for _, lock in self.held}


@dataclass(slots=True)
class Polled:
    """One subscription's poll: what it asked for, the rows to deliver, when to look again,
    and whether the statement filled the batch (more is due already)."""

    sub: Subscription
    want: int
    envs: list[Envelope]
    next_due: int | None
    more: bool


def refill(window: int) -> int:
    """The room a backlogged subscription waits for: half its window."""
    return max(window // 2, 1)

