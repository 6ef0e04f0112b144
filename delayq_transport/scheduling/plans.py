"""What one refresh works with: the settings, each entry's :class:`Plan` for this refresh, the
:class:`Occurrence` a front end's :class:`Delivery` encodes, and the :class:`RefreshReport`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any, Protocol

from ..core.integrations import DEFAULT_MIN_LEAD, cron_key
from ..core.queue import to_ms
from . import misfire
from .entries import EntrySpec
from .times import Timed

#: Namespace of occurrence task ids: uuid5(NAMESPACE, key), the same in every process.
TASK_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://delayq/beat/occurrence")


def occurrence_task_id(key: str) -> str:
    return str(uuid.uuid5(TASK_ID_NAMESPACE, key))


class Routed(Protocol):
    """Where a front end sends an entry: ``kind`` is the delayed_queue partition polled."""

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of one entry, as the front end's :class:`Delivery` encodes it."""

    spec: EntrySpec
    route: Any
    hash: str
    at: datetime
    next_at: datetime | None

    @property
    def key(self) -> str:
        return cron_key(self.spec.prefix, self.hash, self.at)

    @property
    def task_id(self) -> str:
        """Deterministic (uuid5 of the key): the same message id from every scheduler."""
        return occurrence_task_id(self.key)

    @property
    def at_ms(self) -> int:
        return to_ms(self.at)

    def header(self) -> dict[str, Any]:
        """What the worker-side misfire check reads (:func:`.misfire.misfired`), and the
        store the entry came from when the worker writes its run history there
        (django-celery-beat in admin mode: :func:`.djbeat.record_runs`)."""
        spec = self.spec
        return misfire.occurrence_header(
            spec.name, spec.prefix, self.hash, self.at_ms, spec.misfire, spec.grace_ms,
            None if self.next_at is None else to_ms(self.next_at),
            source=None if spec.source in ("config", "db") else spec.source)


class Delivery(Protocol):
    """A front end's side of the refresh."""

    def route(self, spec: EntrySpec) -> Routed:
        """Where the entry's messages go; raises InvalidInput (naming the entry) if nowhere."""

    def encode(self, occurrence: Occurrence) -> bytes:
        """The stored payload of one occurrence: a message the front end's workers run."""


#: A scheduler's heartbeat lapses after this many of its refresh intervals without a refresh
#: (:mod:`.authority`): one missed refresh does not hand its configuration's authority over.
ALIVE_INTERVALS = 3


@dataclass(frozen=True)
class Settings:
    refresh_interval: timedelta = timedelta(seconds=60)
    horizon: timedelta = timedelta(hours=1)
    min_occurrences: int = 3
    min_lead: timedelta = DEFAULT_MIN_LEAD

    @property
    def alive_for(self) -> timedelta:
        """How long a heartbeat keeps this scheduler alive for the others."""
        return self.refresh_interval * ALIVE_INTERVALS

    @property
    def effective_horizon(self) -> timedelta:
        """At least the refresh intervals a handover of authority may take when the schedulers
        in force vanish (their heartbeats lapse, then every other scheduler refreshes once to
        follow the next configuration and once to act), so no occurrence falls in a hole."""
        return max(self.horizon, self.refresh_interval * (ALIVE_INTERVALS + 2))


@dataclass
class Plan:
    """One entry, resolved for this refresh: its schedule within its bounds, its occurrences in
    the horizon (none when it has ended, or its one instant passed), and the one after them
    (each occurrence's header names its successor)."""

    spec: EntrySpec
    hash: str
    route: Any
    zone: tzinfo
    times: list[datetime]
    following: datetime | None = None
    schedule: Timed | None = None

    @property
    def bounded(self) -> Timed:
        return self.spec.schedule if self.schedule is None else self.schedule

    @property
    def prefix(self) -> str:
        return self.spec.prefix

    def occurrences(self, before: list[datetime] | None = None) -> list[Occurrence]:
        """Occurrences of ``before + times``: consecutive instants of the schedule."""
        times = [*(before or ()), *self.times]
        nexts = [*times[1:], self.following]
        return [Occurrence(self.spec, self.route, self.hash, at, nxt)
                for at, nxt in zip(times, nexts, strict=True)]


@dataclass
class RefreshReport:
    installed: dict[str, int] = field(default_factory=dict)   # entry -> rows created
    replaced: list[str] = field(default_factory=list)         # entries whose config changed
    uninstalled: dict[str, int] = field(default_factory=dict)  # entry -> rows deleted
    errors: dict[str, str] = field(default_factory=dict)      # entry -> why it was skipped
    misfires_dropped: int = 0
    #: False: another configuration is in force (or taking over), so this refresh only
    #: recorded its heartbeat (:mod:`.authority`).
    in_force: bool = True
