"""The periodic actors declared in this process (:func:`~.periodic.periodic` fills it), and the
worker-side check that reads it.

Below both the periodic module and the consumer: the consumer asks :func:`superseded` about a
late occurrence, and the periodic module imports the broker, which imports the consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

import dramatiq

from ..scheduling.entries import EntrySpec, entry_hash
from ..scheduling.times import newer_occurrence_passed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeriodicEntry:
    """One periodic actor: its engine entry and the zone its schedule is read in."""

    spec: EntrySpec
    zone: tzinfo
    actor: dramatiq.Actor[Any, Any]


#: Every entry declared with :func:`periodic` in this process, by entry name.
REGISTRY: dict[str, PeriodicEntry] = {}


def superseded(info: object, now_ms: int) -> bool:
    """Worker side of ``coalesce`` after an outage (see :mod:`.catchup`): True if the
    occurrence ``info`` (a message's ``delayq_periodic`` option) misfired and a newer
    occurrence of its entry is already past, installed or not, so that one is the run.

    For occurrences whose header has no ``next_ms`` (installed before it existed), and only
    for entries declared in this process under the same config hash; anything else is left to
    the engine's ``misfired`` (never drop what cannot be checked)."""
    if not isinstance(info, Mapping) or info.get("misfire") != "coalesce":
        return False
    entry = REGISTRY.get(str(info.get("entry")))
    try:
        at_ms, grace_ms = int(info["at_ms"]), int(info["grace_ms"])
    except (KeyError, TypeError, ValueError):
        return False
    if entry is None or now_ms - at_ms <= grace_ms \
            or entry_hash(entry.spec, entry.zone) != info.get("hash"):
        return False
    if not newer_occurrence_passed(entry.spec.schedule, entry.zone, at_ms, now_ms):
        return False
    log.warning("delayq periodic: coalescing %s occurrence at %d ms into a newer one "
                "(%.1f s late)", entry.spec.name, at_ms, (now_ms - at_ms) / 1000)
    return True
