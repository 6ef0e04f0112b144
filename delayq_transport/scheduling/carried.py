"""Entries carried over from another scheduler's store, before they become :class:`EntrySpec`
(``delayq beat import`` stores them as DB-backed entries; a beat in admin mode installs them
straight from django-celery-beat's tables).

A :class:`Carried` entry holds every field of its source in the engine's terms, or the source
entry is refused with the reason (:class:`Refused`): nothing is dropped or changed silently.
What a reader chose where the source leaves something implicit (an interval's anchor) goes into
``notes``, which ``--dry-run`` prints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..core import InvalidInput
from ..core.queue import from_ms, to_ms
from .entries import make_spec, storable_options
from .schedules import Interval, Schedule


class Refused(InvalidInput):
    """A source entry that cannot be carried; the message names the entry and the reason."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"entry {name!r}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(frozen=True)
class Carried:
    """One source entry in the engine's terms: what :func:`~.entries.make_spec` takes, whether
    the entry runs (``enabled``: the source's flag, unless a one-off already ran), and its
    history (``last_run_at``, ``total_run_count``, the source's own ``enabled``, ``ran``: a
    one-off that ran), which shapes the entry but is not stored."""

    name: str
    task: str
    schedule: Schedule
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    enabled: bool = True
    notes: tuple[str, ...] = ()
    history: Mapping[str, Any] = field(default_factory=dict)

    def validated(self) -> Carried:
        """Itself, once the engine accepts it (else :class:`Refused` with the engine's reason)."""
        try:
            make_spec(self.name, self.task, self.schedule, self.args, self.kwargs, self.options)
        except InvalidInput as exc:
            reason = str(exc).removeprefix(f"beat entry {self.name!r}: ")
            raise Refused(self.name, reason) from exc
        return self

    @property
    def source_enabled(self) -> bool:
        """The flag in the source (a one-off that ran may still be enabled there)."""
        return bool(self.history.get("enabled", self.enabled))

    def definition(self) -> dict[str, Any]:
        """The DB-backed entry's definition (as ``EntryStore.add`` stores it)."""
        from .schedules import schedule_to_json

        return {"task": self.task, "schedule": schedule_to_json(self.schedule),
                "args": list(self.args), "kwargs": dict(self.kwargs),
                "options": storable_options(self.options)}


def json_value(name: str, what: str, text: str | None, kind: type, default: Any) -> Any:
    """A JSON text column (args, kwargs, headers), refused when it is not JSON of ``kind``."""
    if text is None or not str(text).strip():
        return default
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise Refused(name, f"{what} is not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(value, kind):
        raise Refused(name, f"{what} must be a JSON {kind.__name__}, got {text!r}")
    return value


def interval_anchor(seconds: float, last_run_at: datetime | None, start_time: datetime | None,
                    counted_from: datetime | None, *, normalize: bool) -> tuple[Any, str]:
    """Where an interval entry counts its periods from, as its source does: its last run, else
    its start time (the engine's default anchor then), else ``counted_from`` (the source's
    notion of "created"). With ``normalize`` the anchor is the first instant of that lattice
    after the epoch, so the entry's config hash does not move as its last run does (admin mode:
    each run writes ``last_run_at`` back, always on the lattice). Returns (anchor, note)."""
    at = last_run_at or (None if start_time is not None else counted_from)
    if at is None:
        return None, "counted from its start time"
    why = "its last run" if last_run_at is not None else "when it was last changed"
    if normalize:
        period_ms = round(seconds * 1000)
        return from_ms(to_ms(at) % period_ms), f"every {seconds:g}s counted from {why}"
    return at, f"every {seconds:g}s counted from {why} ({at.isoformat()})"


def first_install_anchor(sched: Schedule, options: dict[str, Any]) -> str | None:
    """Intervals without an anchor of their own are counted from their first install (as
    Celery's beat counts from its start): the note says so."""
    if isinstance(sched, Interval) and "delayq_anchor" not in options \
            and "delayq_start_time" not in options:
        options["delayq_anchor"] = "first_install"
        return "counted from its first install (as Celery's beat counts from its start)"
    return None
