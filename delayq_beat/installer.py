"""Celery beat's side of the refresh: where an entry's messages go and what they look like.

The refresh itself is the scheduling engine's (:mod:`delayq_transport.scheduling.installer`);
this module gives it a :class:`CeleryDelivery`, which routes an entry to a queue kind as the
kombu transport names them and writes each occurrence as a ready-to-run Celery task message
(task id = uuid5 of its key, so the same bytes from any beat; the ``delayq_beat`` header for
the worker's misfire check; ``periodic_task_name``, the entry's name, which
django-celery-results records; ``expires`` relative to the occurrence).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any

from delayq_transport.core import InvalidInput
from delayq_transport.core.queue import DelayedQueue, to_ms
from delayq_transport.formats import celery as messages
from delayq_transport.scheduling import installer as engine
from delayq_transport.scheduling.entries import instant
from delayq_transport.scheduling.misfire import HEADER
from delayq_transport.scheduling.plans import (
    Occurrence,
    Plan,
    RefreshReport,
    Settings,
    occurrence_task_id,
)
from delayq_transport.scheduling.store import EntryStore

from .entries import EntrySpec

__all__ = ["CeleryDelivery", "Installer", "Plan", "RefreshReport", "Route", "Settings",
           "default_route", "occurrence_task_id"]


@dataclass(frozen=True)
class Route:
    """Where an entry's messages go; ``kind`` is the delayed_queue partition the worker polls."""

    queue: str = messages.DEFAULT_QUEUE
    exchange: str = ""
    routing_key: str | None = None
    priority: int | None = None

    @property
    def kind(self) -> str:
        return messages.kind_for(self.queue, self.priority)


def default_route(spec: EntrySpec) -> Route:
    """Routing from the entry's own options only (no app), for tests and the CLI."""
    o = spec.options
    return Route(str(o.get("queue") or messages.DEFAULT_QUEUE), str(o.get("exchange") or ""),
                 o.get("routing_key"), o.get("priority"))


class CeleryDelivery:
    """Celery task messages, routed by ``route`` (the beat's app router, or the options)."""

    def __init__(self, route: Callable[[EntrySpec], Route] = default_route) -> None:
        self._route = route

    def route(self, spec: EntrySpec) -> Route:
        return self._route(spec)

    def encode(self, occurrence: Occurrence) -> bytes:
        return messages.encode(self.message(occurrence))

    def message(self, occurrence: Occurrence) -> dict[str, Any]:
        spec, route, task_id = occurrence.spec, occurrence.route, occurrence.task_id
        headers = dict(spec.options.get("headers") or {})
        headers["celery_beat_task"] = True
        # The entry's name, as django-celery-beat sends it and django-celery-results shows it.
        headers.setdefault("periodic_task_name", spec.name)
        headers[HEADER] = occurrence.header()
        msg = messages.task_message(
            spec.task, spec.args, spec.kwargs, task_id=task_id,
            expires=_expires(spec, occurrence.at), queue=route.queue, exchange=route.exchange,
            routing_key=route.routing_key, priority=route.priority,
            origin="delayq-beat", extra_headers=headers,
        )
        msg["properties"]["delivery_tag"] = task_id  # deterministic: same bytes from any beat
        return msg


class Installer(engine.Installer):
    """The engine's installer writing Celery task messages (``route``: default, the entry's
    options; the beat's Scheduler passes its app's router)."""

    def __init__(self, queue: DelayedQueue, store: EntryStore, zone: tzinfo,
                 settings: Settings | None = None, *,
                 route: Callable[[EntrySpec], Route] = default_route,
                 spec_defaults: Mapping[str, Any] | None = None,
                 check_task: Callable[[EntrySpec], None] | None = None) -> None:
        super().__init__(queue, store, zone, settings, delivery=CeleryDelivery(route),
                         spec_defaults=spec_defaults, check_task=check_task)


def _expires(spec: EntrySpec, at: datetime) -> datetime | None:
    """Celery's ``expires``: seconds after the occurrence, or an aware datetime."""
    value = spec.options.get("expires")
    if value is None:
        return None
    if isinstance(value, str):  # a datetime as a DB-backed entry stores it (ISO-8601)
        value = instant(value, f"beat entry {spec.name!r}: expires")
    if isinstance(value, datetime):
        to_ms(value, what=f"beat entry {spec.name!r}: expires")
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return at + timedelta(seconds=value)
    raise InvalidInput(f"beat entry {spec.name!r}: expires must be seconds or an aware "
                       f"datetime, got {value!r}")
