"""Misfire policy: what happens to occurrences that were due while no worker ran.

Occurrences are installed ahead of time, so after an outage of the workers every one of them is
due at once. Each entry chooses (an occurrence *misfired* when it is still waiting more than
its grace after its time):

* ``coalesce`` (default, like Celery beat's single catch-up run): of the misfired occurrences
  only the newest due one runs;
* ``run_all``: every occurrence runs, late;
* ``skip``: misfired occurrences are dropped; only on-time ones run.

It is applied twice: by every refresh (:func:`sweep`, one statement for all entries) and by the
worker as it receives a row (:func:`dropped`, the consumer session's predicate for every front
end), so a worker that comes back before any scheduler does not run a backlog first. Every
occurrence carries a header (Celery: the message header ``delayq_beat``; Dramatiq: the option
``delayq_periodic``; django.tasks: the payload's field ``delayq_periodic``) with
``{"entry", "prefix", "hash", "at_ms", "misfire", "grace_ms", "next_ms"}`` for that:
``next_ms`` is the entry's next occurrence, so under ``coalesce`` a misfired occurrence whose
next one is already past is dropped even when that next one was never installed (the
scheduler's catch-up runs it, see :mod:`.catchup`): an outage still runs once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from ..core.integrations import newer_occurrence_due, sweep_misfired
from ..core.queue import DelayedQueue, Envelope, like_escape, to_ms

log = logging.getLogger(__name__)

#: The Celery message header carrying an occurrence's identity and policy.
HEADER = "delayq_beat"


def config_pattern(prefix: str, hash_: str) -> str:
    """LIKE pattern of one entry's rows under one config hash (metacharacters escaped)."""
    return like_escape(f"{prefix}/{hash_}/") + "%"


def occurrence_header(entry: str, prefix: str, hash_: str, at_ms: int, misfire: str,
                      grace_ms: int, next_ms: int | None = None, *,
                      source: str | None = None) -> dict[str, Any]:
    header: dict[str, Any] = {"entry": entry, "prefix": prefix, "hash": hash_, "at_ms": at_ms,
                              "misfire": misfire, "grace_ms": grace_ms}
    if next_ms is not None:
        header["next_ms"] = next_ms
    if source is not None:
        header["source"] = source
    return header


def sweep(queue: DelayedQueue, policies: Sequence[tuple[str, str, str, str, int]]) -> int:
    """Apply each entry's policy to its due rows; items are (kind, prefix, hash, policy, grace_ms).

    Returns how many occurrences were dropped; each is logged.
    """
    active = [p for p in policies if p[3] != "run_all"]
    if not active:
        return 0
    rows = sweep_misfired(
        queue, [p[0] for p in active], [config_pattern(p[1], p[2]) for p in active],
        [p[3] for p in active], [int(p[4]) for p in active])
    for key, kind in rows:
        log.warning("delayq schedule: dropped misfired occurrence %s (queue kind %r)", key, kind)
    return len(rows)


def dropped(queue: DelayedQueue, envs: Sequence[Envelope],
            header_of: Callable[[bytes], object], *,
            superseded: Callable[[object, int], bool] | None = None) -> list[Envelope]:
    """The consumer session's misfire predicate (core/queue/session.py), one for every front
    end: of the rows a poll took, the occurrences to ack without running, by their entry's
    policy (:func:`misfired`, or the front end's ``superseded`` check). ``header_of`` reads an
    occurrence's header from a payload (None: not an occurrence, or unreadable: delivered, and
    the front end deals with it). The queue's clock is read once per poll, and only when an
    occurrence is late enough to need it. The occurrences kept whose entry is a row of
    django-celery-beat (admin mode) are written to its run history, as its beat would."""
    found = [(env, header_of(env.payload)) for env in envs]
    found = [(env, info) for env, info in found if info is not None]
    if not found:
        return []
    clock = cache(lambda: to_ms(queue.now()))
    out: list[Envelope] = []
    kept: list[tuple[str, object]] = []
    for env, info in found:
        if _misfired(queue, env.kind, info, clock) or (
                superseded is not None and _late(info) and superseded(info, clock())):
            out.append(env)
        else:
            kept.append((env.key, info))
    if any(isinstance(i, Mapping) and i.get("source") for _, i in kept):
        from .djbeat import record_runs  # only for entries of django-celery-beat's tables

        record_runs(queue, kept)
    return out


def _late(info: object) -> bool:
    """Whether a header could be judged late at all (a checkable policy): the clock is read
    only for those."""
    return isinstance(info, Mapping) and info.get("misfire") in ("coalesce", "skip")


def misfired(queue: DelayedQueue, kind: str, info: object, now_ms: int | None = None) -> bool:
    """True if the consumer should ack the occurrence with header ``info`` without running it.

    Rows without a header, on-time occurrences and ``run_all`` entries return False without
    touching the database; a malformed header never loses a task. ``now_ms`` defaults to the
    queue's clock."""
    return _misfired(queue, kind, info,
                     lambda: to_ms(queue.now()) if now_ms is None else now_ms)


def _misfired(queue: DelayedQueue, kind: str, info: object, clock: Callable[[], int]) -> bool:
    if not _late(info):
        return False
    assert isinstance(info, Mapping)
    try:
        at_ms, grace_ms = int(info["at_ms"]), int(info["grace_ms"])
        pattern = config_pattern(str(info["prefix"]), str(info["hash"]))
        next_ms = info.get("next_ms")
        next_ms = None if next_ms is None or isinstance(next_ms, bool) else int(next_ms)
    except (KeyError, TypeError, ValueError):
        return False
    now = clock()
    if now - at_ms <= grace_ms:
        return False
    if info["misfire"] == "skip":
        log.warning("delayq schedule: skipping %s occurrence at %d ms (%.1f s late)",
                    info.get("entry"), at_ms, (now - at_ms) / 1000)
        return True
    if (next_ms is not None and next_ms <= now) or \
            newer_occurrence_due(queue, kind, pattern, at_ms, now):
        log.warning("delayq schedule: coalescing %s occurrence at %d ms into a newer one",
                    info.get("entry"), at_ms)
        return True
    return False


def drop_misfired(queue: DelayedQueue, kind: str, message: Mapping[str, Any],
                  now_ms: int | None = None) -> bool:
    """:func:`misfired` for a Celery message (its ``delayq_beat`` header)."""
    return misfired(queue, kind, (message.get("headers") or {}).get(HEADER), now_ms)
