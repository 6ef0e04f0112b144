"""Pause, resume and limit a queue by the name its users give it, for ``delayq queues``, the
page, the metrics and the Django admin: the core's controls (core/queue/controls.py) plus the
one thing the core cannot know, which names are queues (``formats/queues.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import InvalidInput
from ..core.inspect import Inspector
from ..core.queue import (
    UNCHANGED,
    Control,
    ControlUse,
    DelayedQueue,
    controls_use,
    format_rate,
    queues_seen,
    set_control,
)
from ..formats.queues import queue_names

#: The form's fields, by the limit each sets; an empty field leaves it, "none" removes it.
LIMIT_FIELDS = ("concurrency", "key_concurrency", "rate", "key_rate")


def limit_changes(body: dict[str, str]) -> dict[str, Any]:
    """A form's limit fields (the page's, the Django admin's) as :meth:`QueueControls.limit`
    takes them."""
    changes: dict[str, Any] = {}
    for field in LIMIT_FIELDS:
        value = str(body.get(field, "")).strip()
        if not value:
            changes[field] = UNCHANGED
        elif value.lower() == "none":
            changes[field] = None
        elif field.endswith("concurrency"):
            try:
                changes[field] = int(value)
            except ValueError:
                raise InvalidInput(f"{field.replace('_', ' ')} {value!r} is not a whole "
                                   "number (or 'none')") from None
        else:
            changes[field] = value
    return changes


@dataclass(frozen=True)
class ControlView:
    """A control as the front ends show it."""

    use: ControlUse

    def as_dict(self) -> dict[str, Any]:
        c: Control = self.use.control
        return {"queue": c.name, "paused": c.paused, "concurrency": c.concurrency,
                "key_concurrency": c.key_concurrency, "rate": format_rate(*(c.rate or (None,
                None))), "key_rate": format_rate(*(c.key_rate or (None, None))),
                "in_use": self.use.in_use, "keys_in_use": self.use.keys_in_use,
                "tokens": None if self.use.tokens is None else round(self.use.tokens, 2)}


class QueueControls:
    """The controls of one queue table, refusing a name that is no queue."""

    def __init__(self, queue: DelayedQueue) -> None:
        self.queue = queue

    def known(self) -> set[str]:
        """Queue names in use: of the kinds holding rows (every front end's names), the
        queues Celery consumers declared, and the queues already controlled."""
        names = {n for kind in Inspector(self.queue).kinds() for n in queue_names(kind) | {kind}}
        names |= {s.queue for s in queues_seen(self.queue) if not s.auto_delete}
        return names | {u.control.name for u in controls_use(self.queue)}

    def plain_names(self) -> set[str]:
        """Each queue holding rows by its shortest name (``mail``, not ``dramatiq:mail``)."""
        return {min(queue_names(kind) or {kind}, key=len)
                for kind in Inspector(self.queue).kinds() if queue_names(kind)}

    def check(self, name: str) -> str:
        known = self.known()
        if name not in known:
            shown = ", ".join(sorted(known)[:20]) or "none"
            raise InvalidInput(f"unknown queue {name!r}: no task of it is stored and no "
                               f"consumer declared it (queues: {shown})")
        return name

    def list(self) -> list[ControlView]:
        return [ControlView(u) for u in controls_use(self.queue)]

    def pause(self, name: str) -> Control:
        return set_control(self.queue, self.check(name), paused=True)

    def resume(self, name: str) -> Control:
        return set_control(self.queue, self.check(name), paused=False)

    def limit(self, name: str, *, concurrency: Any = UNCHANGED, key_concurrency: Any = UNCHANGED,
              rate: Any = UNCHANGED, key_rate: Any = UNCHANGED) -> Control:
        return set_control(self.queue, self.check(name), concurrency=concurrency,
                           key_concurrency=key_concurrency, rate=rate, key_rate=key_rate)
