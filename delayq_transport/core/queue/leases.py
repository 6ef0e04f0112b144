"""Who holds what: lock ids that name their process, and the workers read back from leases.

A poll takes its rows under a fresh lock id (``lockUuid``), so a lock is one poll, not one
worker. Every lock id this process makes starts with the same 8-hex-digit tag (the process'
*worker tag*, new in each process and after each fork), and the rest is random like a
uuid4's: the web page groups live locks by that tag into worker processes without any write
of its own on the hot path. Lock ids made by delayq versions before the tag (plain uuid4s)
group one poll per "worker".

The queues consumers declared, and when one was last seen, come from the bindings heartbeat
(``bindings_touch``, Celery workers only; Dramatiq consumers hold no bindings).
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .counts import bounded_read
from .timeutil import to_ms

if TYPE_CHECKING:
    from .handle import QueueHandle

log = logging.getLogger(__name__)

#: Leased rows read per call: workers hold their prefetch, a few hundred rows at most.
LEASES_CAP = 10_000
BINDINGS_CAP = 1_000
TAG_LEN = 8

_tag: list[str] = []


def _new_tag() -> None:
    _tag[:] = [secrets.token_hex(TAG_LEN // 2)]


_new_tag()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_tag)  # a forked worker is a worker of its own


def worker_tag() -> str:
    """This process' tag: the first 8 characters of every lock id it makes."""
    return _tag[0]


def new_lock() -> str:
    """A lock id for one poll: the worker tag, a dash and 27 random hex digits (36 characters,
    the column's width, as a uuid4's text; 108 random bits, and ~5x cheaper to make than
    ``str(uuid.uuid4())``)."""
    return f"{_tag[0]}-{os.urandom(14).hex()[:27]}"


@dataclass(frozen=True, slots=True)
class Lease:
    """The rows one poll (``lock``) holds in one kind."""

    lock: str
    kind: str
    rows: int
    lease_min_ms: int
    lease_max_ms: int
    oldest_eta_ms: int


@dataclass
class Worker:
    """A worker process as its leases show it: every lock that starts with its tag."""

    tag: str
    leases: list[Lease] = field(default_factory=list)
    now_ms: int = 0

    @property
    def rows(self) -> int:
        return sum(lease.rows for lease in self.leases)

    @property
    def lease_end_ms(self) -> int:
        """When its rows come back if it stops renewing (the latest lease end)."""
        return max(lease.lease_max_ms for lease in self.leases)

    @property
    def live(self) -> bool:
        return self.lease_end_ms > self.now_ms

    @property
    def kinds(self) -> list[str]:
        return sorted({lease.kind for lease in self.leases})


def workers(queue: QueueHandle, cap: int = LEASES_CAP) -> tuple[list[Worker], bool, int]:
    """(workers by rows held, whether ``cap`` cut the read short, the database's now)."""
    rows = bounded_read(queue, "leases_held", {"cap": int(cap), "now": queue.clock_ms()})
    found: dict[str, Worker] = {}
    for lock, kind, n, lo, hi, eta, now in rows:
        w = found.setdefault(lock[:TAG_LEN], Worker(lock[:TAG_LEN], now_ms=int(now)))
        w.leases.append(Lease(lock, kind, int(n), int(lo), int(hi), int(eta)))
    now_ms = int(rows[0][-1]) if rows else to_ms(queue.now())
    held = sum(w.rows for w in found.values())
    return sorted(found.values(), key=lambda w: (-w.rows, w.tag)), held >= cap, now_ms


@dataclass(frozen=True, slots=True)
class SeenQueue:
    queue: str
    seen_at_ms: int
    auto_delete: bool


def queues_seen(queue: QueueHandle, limit: int = BINDINGS_CAP) -> list[SeenQueue]:
    """Every queue a consumer declared, with its last heartbeat (Celery workers touch theirs
    every 15 s while they consume)."""
    rows = queue.db.fetchall(queue.queries["bindings_seen"], {"limit": int(limit)})
    return [SeenQueue(r[0], int(r[1]), bool(r[2])) for r in rows]
