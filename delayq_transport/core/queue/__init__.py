"""The queue and its hot path: :class:`DelayedQueue` on one table, and everything a publish
or a delivery goes through.

* Publishing: :mod:`.offer` (the compare-and-swap offer over one :mod:`.executor` interface),
  :mod:`.combine` (concurrent publishes share one insert and commit), :mod:`.publish_buffer`,
  :mod:`.joined` (inside the caller's transaction), :mod:`.offer_rows`, :mod:`.once`
  (``delayq move-from``'s offers recorded once), :mod:`.announce` (wake-ups after the commit).
* Consuming: :mod:`.session` (the one consumer session under kombu's channel and Dramatiq's
  consumer), :mod:`.listen` (LISTEN), :mod:`.watermark` (where a poll starts), :mod:`.leases`
  (who holds what), :mod:`.dead_letters` (dead letters and kept kinds), :mod:`.counts`.
* What crosses its API: :mod:`.types`, :mod:`.validate`, :mod:`.timeutil`, :mod:`.options`
  (the adapters' declared settings), :mod:`.handle` (a queue as helper modules see it).

Its statements are ``queue.sql``. It stands on :mod:`..db` and checks :mod:`..schema` when it
opens; inspection, the ledgers and the integrations' tables stand on it, never the reverse.
Adapters import the names of ``__all__``, never a module of this folder.
"""

from __future__ import annotations

from .controls import (
    UNCHANGED,
    Control,
    ControlUse,
    Naming,
    controls_use,
    format_rate,
    parse_rate,
    set_control,
)
from .counts import AT_LEAST, COUNT_CAP, ESTIMATE, kind_row_estimates, past_the_cap
from .dead_letters import (
    count_all,
    dead_letter,
    dead_letters_count,
    dead_letters_page,
    delete_dead_letters,
    expire,
    kinds_ending,
    kinds_with_prefix,
    list_kinds,
    requeue_dead_letter,
)
from .delayed_queue import DelayedQueue
from .joined import Joined, current, detached, set_implicit, transaction
from .leases import LEASES_CAP, queues_seen, workers
from .listen import Listener
from .once import OnceOffer, OnceOutcome
from .options import (
    IS_FLAG,
    IS_MAPPING,
    IS_NAME,
    IS_TABLE,
    Check,
    Option,
    Options,
    optional,
    seconds,
    whole,
)
from .pacing import Subscription
from .publish_buffer import (
    DEFAULT_MAX_PENDING,
    DEFAULT_PUT_TIMEOUT_S,
    MAX_LINGER_S,
    PublishBuffer,
    check_linger,
)
from .session import Session
from .timeutil import due_ms, duration_ms, from_ms, to_ms
from .types import Envelope, KindStatus, Offer, OfferOutcome, StoredMessage
from .validate import MAX_KEY_CHARS, MAX_KIND_CHARS, like_escape, validate_key, validate_kind
from .watermark import DEFAULT_FULL_RESCAN_INTERVAL_S

__all__ = [
    "UNCHANGED",
    "Control",
    "ControlUse",
    "Naming",
    "controls_use",
    "format_rate",
    "parse_rate",
    "set_control",
    "AT_LEAST",
    "COUNT_CAP",
    "DEFAULT_FULL_RESCAN_INTERVAL_S",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_PUT_TIMEOUT_S",
    "ESTIMATE",
    "IS_FLAG",
    "IS_MAPPING",
    "IS_NAME",
    "IS_TABLE",
    "LEASES_CAP",
    "MAX_KEY_CHARS",
    "MAX_KIND_CHARS",
    "MAX_LINGER_S",
    "Check",
    "DelayedQueue",
    "Envelope",
    "Joined",
    "KindStatus",
    "Listener",
    "Offer",
    "OfferOutcome",
    "OnceOffer",
    "OnceOutcome",
    "Option",
    "Options",
    "PublishBuffer",
    "Session",
    "StoredMessage",
    "Subscription",
    "check_linger",
    "count_all",
    "current",
    "dead_letter",
    "dead_letters_count",
    "dead_letters_page",
    "delete_dead_letters",
    "detached",
    "due_ms",
    "duration_ms",
    "expire",
    "from_ms",
    "kind_row_estimates",
    "kinds_ending",
    "kinds_with_prefix",
    "like_escape",
    "list_kinds",
    "optional",
    "past_the_cap",
    "queues_seen",
    "requeue_dead_letter",
    "seconds",
    "set_implicit",
    "to_ms",
    "transaction",
    "validate_key",
    "validate_kind",
    "whole",
    "workers",
]
