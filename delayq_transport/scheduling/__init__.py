"""The scheduling engine: periodic entries installed ahead of time, for every front end.

Knows neither Celery nor Dramatiq: Celery beat (:mod:`delayq_beat`) and Dramatiq's periodic
actors (:mod:`delayq_transport.dramatiq.periodic`) translate their entries into an
:class:`EntrySpec` and give the :class:`Installer` a :class:`Delivery` that encodes their own
messages; everything else is here, once:

* :mod:`.schedules`: interval (anchored or not), crontab, solar and clocked (one instant)
  schedules, their fingerprint and JSON;
* :mod:`.bounds`: an entry's start, end, one-off flag and first-install anchor made into the
  window a refresh installs from;
* :mod:`.times`: the UTC instants a schedule fires at (time zones and DST);
* :mod:`.entries`: entries, key prefixes and config hashes;
* :mod:`.installer` / :mod:`.plans`: the refresh that installs occurrences;
* :mod:`.catchup`: the outage catch-up of occurrences no scheduler installed;
* :mod:`.misfire`: misfire policies, swept by the refresh and checked by the worker (one
  predicate for every front end's consumer);
* :mod:`.authority`: which configuration is in force when schedulers of different ones run at
  once (a rolling deploy);
* :mod:`.store`: DB-backed entries and the ledger; :mod:`.listing`: what listings show;
* :mod:`.refresher`: the refresh loop of the in-process schedulers (django.tasks, Dramatiq).

It sits between the core (whose API it calls; it holds no SQL) and the front ends.
"""

from __future__ import annotations

from .catchup import MAX_CATCH_UP, catch_up_times
from .entries import (
    DEFAULT_GRACE_S,
    DEFAULT_MISFIRE,
    MISFIRE_POLICIES,
    EntrySpec,
    entry_hash,
    entry_name,
    key_prefix,
    make_spec,
)
from .installer import Installer
from .misfire import HEADER, drop_misfired, dropped, misfired
from .plans import Delivery, Occurrence, Plan, RefreshReport, Settings, occurrence_task_id
from .refresher import RefreshThread
from .schedules import Clocked, Crontab, Interval, Schedule, Solar, Window, parse_crontab
from .store import EntryStore, InstalledEntry, StoredEntry
from .times import newest_occurrences, next_after, occurrences

__all__ = [
    "DEFAULT_GRACE_S", "DEFAULT_MISFIRE", "HEADER", "MAX_CATCH_UP", "MISFIRE_POLICIES",
    "Clocked", "Crontab", "Delivery", "EntrySpec", "EntryStore", "InstalledEntry", "Installer",
    "Interval", "Occurrence", "Plan", "RefreshReport", "RefreshThread", "Schedule", "Settings",
    "Solar",
    "StoredEntry", "Window", "catch_up_times", "drop_misfired", "dropped", "entry_hash",
    "entry_name",
    "key_prefix", "make_spec", "misfired", "newest_occurrences", "next_after",
    "occurrence_task_id", "occurrences", "parse_crontab",
]
