"""Fleet-wide control of a queue, held in the database: paused, a concurrency limit and a rate
limit, each for the whole queue or per key (docs/how-to/limits.md).

A control is a row of migration 21's ``<table>__controls``, named after a queue; which kinds
are that queue's is the front end's to say (``formats/queues.py``, handed to the queue as a
:class:`Naming`). A queue without a control row is claimed by ``try_poll_many`` exactly as
before; a controlled one by the claim function (``controls_claim_function``), which reads the
control on every call, so a change holds at the next poll of a controlled queue. Whether a
queue is controlled at all is what consumers cache (:class:`Controls`): every change sends a
marker wake-up (:data:`CONTROL_NOTE`) on the table's channel, and a consumer that cannot LISTEN
reads the controls again every :data:`UNHEARD_REFRESH_S`.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from ..db.errors import InvalidInput, SchemaMissing
from ..db.rows import PolledRow

if TYPE_CHECKING:
    from .handle import QueueHandle

#: The wake-up every change sends (``kind:ms`` form, a kind no consumer polls).
CONTROL_NOTE = "\x1fcontrols"
#: Without LISTEN (a transaction pooler), consumers read the controls again this often.
UNHEARD_REFRESH_S = 1.0
#: A claim a concurrency or key limit held back looks again this much later (ms), in case no
#: wake-up of a freed slot reaches it (an ack of a limited row is deleted at once and wakes the
#: claimers: core/queue/session.py).
RETRY_MS = 50
#: Keyed limits choose among this many due rows per claim: a key at its limit lets the others
#: behind it through, up to this far down the queue.
KEY_WINDOW = 200
#: A token bucket holds at most this long of its rate (at least one token): tokens a late poll
#: did not take are not lost, and no window of time gets more than this over the rate.
BURST_MS = 100

_RATE = re.compile(r"^\s*(\d+)\s*(?:/\s*(\d*)\s*([smh]))?\s*$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}


class Naming(Protocol):
    """What the core needs of a front end's naming: the queue names that select a kind
    (``formats/queues.py``) and where a task of that kind carries its key."""

    def queue_names(self, kind: str) -> set[str]: ...

    def limit_key_path(self, kind: str) -> str | None: ...


class _KindsOnly:
    """The naming of a queue no front end named: a control selects the kind of its name."""

    def queue_names(self, kind: str) -> set[str]:
        return set()

    def limit_key_path(self, kind: str) -> str | None:
        return None


def parse_rate(text: str, *, what: str = "rate") -> tuple[int, int]:
    """``N/s``, ``N/m``, ``N/h`` (Celery's notation), ``N/10s`` or ``N`` (per second) as
    (count, interval in ms). Refused with the text itself otherwise."""
    m = _RATE.match(str(text))
    if not m or int(m.group(1)) <= 0 or m.group(2) == "0":
        raise InvalidInput(f"{what} {text!r} cannot be parsed: give N/s, N/m, N/h or N/<k>s "
                           "with N a whole number above 0 (e.g. 50/s, 100/m, 1/10s)")
    count, times, unit = int(m.group(1)), int(m.group(2) or 1), m.group(3) or "s"
    return count, times * _UNIT_MS[unit]


def format_rate(count: int | None, ms: int | None) -> str | None:
    if count is None or ms is None:
        return None
    for unit, unit_ms in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % unit_ms == 0:
            n = ms // unit_ms
            return f"{count}/{'' if n == 1 else n}{unit}"
    return f"{count}/{ms / 1000:g}s"


@dataclass(frozen=True)
class Control:
    """One queue's control as stored. Rates are (count, interval ms)."""

    name: str
    paused: bool = False
    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: tuple[int, int] | None = None
    key_rate: tuple[int, int] | None = None

    @classmethod
    def of_row(cls, row: Sequence[Any]) -> Control:
        rate = (row[4], row[5]) if row[4] is not None else None
        key_rate = (row[6], row[7]) if row[6] is not None else None
        return cls(row[0], bool(row[1]), row[2], row[3], rate, key_rate)

    @property
    def empty(self) -> bool:
        return not self.paused and self == Control(self.name)

    @property
    def keyed(self) -> bool:
        return self.key_concurrency is not None or self.key_rate is not None


@dataclass(frozen=True)
class ControlUse:
    """A control and what it holds now: leased rows of it (``in_use``, running or
    prefetched), the keys among them, the tokens in its bucket (None: no rate)."""

    control: Control
    in_use: int
    keys_in_use: int
    tokens: float | None
    updated_at_ms: int


def _limit(value: int | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(f"{what} must be a whole number above 0, not {value!r}")
    return value


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


#: A setting :func:`set_control` leaves as it is.
UNCHANGED: Any = _Unchanged()


def read_controls(queue: QueueHandle) -> list[Control]:
    return [Control.of_row(r) for r in queue.db.fetchall(queue.queries["controls_read"])]


def controls_use(queue: QueueHandle) -> list[ControlUse]:
    """Every control with its use now (``delayq status``, the page, the metrics)."""
    rows = queue.db.fetchall(queue.queries["controls_use"],
                             {"now": queue.clock_ms(), "burst_ms": BURST_MS})
    return [ControlUse(Control.of_row(r), int(r[8]), int(r[9]),
                       None if r[10] is None else float(r[10]), int(r[11])) for r in rows]


def set_control(queue: QueueHandle, name: str, *, paused: bool = UNCHANGED,
                concurrency: int | None = UNCHANGED, key_concurrency: int | None = UNCHANGED,
                rate: str | None = UNCHANGED, key_rate: str | None = UNCHANGED) -> Control:
    """Change a queue's control (what is not given stays; None removes a limit) in one
    transaction under the row's lock, and tell every consumer. A control left with nothing is
    deleted: the queue is claimed as if never controlled. Bad values are refused before any
    change, naming the value."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput(f"queue name {name!r}: give the name of a queue")
    changes: dict[str, Any] = {}
    if paused is not UNCHANGED:
        changes["paused"] = bool(paused)
    for field, limit in (("concurrency", concurrency), ("key_concurrency", key_concurrency)):
        if limit is not UNCHANGED:
            changes[field] = _limit(limit, f"{field.replace('_', ' ')} limit of {name!r}")
    for field, text in (("rate", rate), ("key_rate", key_rate)):
        if text is not UNCHANGED:
            changes[field] = None if text is None else parse_rate(
                text, what=f"{field.replace('_', ' ')} of {name!r}")
    q = queue.queries

    def work(conn: psycopg.Connection[Any]) -> Control:
        with conn.transaction():
            row = conn.execute(q["control_lock"], {"name": name}).fetchone()
            new = replace(Control(name) if row is None else Control.of_row(row), **changes)
            if new.empty:
                conn.execute(q["control_delete"], {"name": name, "note": f"{CONTROL_NOTE}:0"})
                return new
            rate, key_rate = new.rate or (None, None), new.key_rate or (None, None)
            conn.execute(q["control_upsert"], {
                "name": name, "paused": new.paused, "concurrency": new.concurrency,
                "key_concurrency": new.key_concurrency, "rate_count": rate[0],
                "rate_ms": rate[1], "key_rate_count": key_rate[0], "key_rate_ms": key_rate[1],
                "now": queue.clock_ms(), "note": f"{CONTROL_NOTE}:0"})
            return new

    return queue.db.run(work)


class Controls:
    """A consumer's view of which of its kinds are controlled, and by which control. Read at
    the first poll, again after a change was heard (:meth:`changed`), and every
    ``max_age_s`` (infinite while the consumer hears its wake-ups)."""

    def __init__(self, queue: QueueHandle, naming: Naming | None = None) -> None:
        self._queue = queue
        self.naming: Naming = naming or _KindsOnly()
        self.max_age_s = math.inf
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._by_name: dict[str, Control] = {}
        self._of_kind: dict[str, str | None] = {}

    def changed(self, heard: bool | None = None) -> None:
        """Read again at the next poll; ``heard``: whether changes will be heard from now on."""
        with self._lock:
            self._read_at = None
            if heard is not None:
                self.max_age_s = math.inf if heard else UNHEARD_REFRESH_S

    def _fresh(self) -> dict[str, Control]:
        with self._lock:
            read_at = self._read_at
            if read_at is not None and time.monotonic() - read_at < self.max_age_s:
                return self._by_name
        try:
            found = {c.name: c for c in read_controls(self._queue)}
        except SchemaMissing:  # a consumer told not to migrate, before migration 21: none
            found = {}
        with self._lock:
            self._by_name, self._of_kind, self._read_at = found, {}, time.monotonic()
        return found

    def control_of(self, kind: str) -> str | None:
        """The control that governs ``kind``: of the names that select it, the longest (a
        front end's qualified name, ``dramatiq:mail``, before the plain ``mail``)."""
        found = self._of_kind.get(kind, "")
        if found != "":
            return found
        names = ({kind} | self.naming.queue_names(kind)) & self._by_name.keys()
        found = max(names, key=lambda n: (len(n), n)) if names else None
        self._of_kind[kind] = found
        return found

    def limited(self, kinds: Iterable[str]) -> list[str]:
        """Of ``kinds``, those a concurrency limit governs, as last read (no statement)."""
        by_name = self._by_name
        if not by_name:
            return []
        found = []
        for kind in kinds:
            name = self.control_of(kind)
            control = by_name.get(name) if name is not None else None
            if control is not None and (control.concurrency or control.key_concurrency):
                found.append(kind)
        return found

    def routes(self, kinds: Sequence[str]) -> list[tuple[str | None, list[str]]] | None:
        """``kinds`` grouped by control, in the order given (None: a group claimed as before);
        None when none of them is controlled, which is the common case and costs no statement
        once read."""
        if not self._fresh():
            return None
        groups: dict[str | None, list[str]] = {}
        for kind in kinds:
            groups.setdefault(self.control_of(kind), []).append(kind)
        if list(groups) == [None]:
            return None
        return list(groups.items())

    def claim(self, name: str, kinds: list[str], n: int, lock: str, lease_ms: int,
              want_next: bool, relaxed: bool) -> list[PolledRow]:
        """One call of the claim function for the kinds of one control."""
        q = self._queue.queries
        params = {"name": name, "kinds": kinds,
                  "key_paths": [self.naming.limit_key_path(k) for k in kinds], "limit": n,
                  "lock": lock, "lease_ms": lease_ms, "now": self._queue.clock_ms(),
                  "want_next": want_next, "retry_ms": RETRY_MS, "key_window": KEY_WINDOW,
                  "burst_ms": BURST_MS}

        def work(conn: psycopg.Connection[Any]) -> list[PolledRow]:
            return [PolledRow(*r) for r in conn.execute(q["claim_controlled"], params)]

        return self._queue.db.run(work, relaxed=relaxed)


def queue_names_of(kinds: Iterable[str], naming: Naming) -> set[str]:
    """Every name that selects one of ``kinds`` (what a control may be named)."""
    return {name for kind in kinds for name in {kind} | naming.queue_names(kind)}
