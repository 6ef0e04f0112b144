"""Each integration's tables: what one front end keeps in the database besides the queue.

* The scheduling engine (Celery beat and Dramatiq's periodic actors alike): recurring
  occurrences pre-installed into the queue under config-hash keys (:mod:`.cron`,
  :class:`CronService`) and its tables, ``delayq_schedule_entries``,
  ``delayq_schedule_installed`` and ``delayq_schedule_schedulers`` (:mod:`.periodic`);
  statements in ``schedule.sql``.
* django-celery-beat's own tables, read and written without Django (:mod:`.djbeat`,
  ``djbeat.sql``).
* The kombu transport's exchange bindings, shared by every process (:mod:`.bindings`,
  ``bindings.sql``).
* Spark's bulk writes at the speed of COPY, recorded in the run ledger (:mod:`.bulk`,
  ``bulk.sql``).

They stand on the queue (and the ledgers); the queue never imports them.
"""

from __future__ import annotations

from .bindings import DEFAULT_BINDING_TTL_S, Bindings
from .bulk import BulkWriter, copy_direct, copy_record, direct_record
from .cron import (
    DEFAULT_MIN_LEAD,
    CronHandle,
    CronMessage,
    CronService,
    DailySchedule,
    config_hash,
    cron_key,
    parse_cron_key,
    periodic_times,
    validate_prefix,
)
from .djbeat import DjangoBeatTables, prune_run_claims
from .djbeat import TaskRow as DjangoBeatTask
from .periodic import (
    EntryRow,
    FirstInstall,
    InstalledRow,
    PeriodicStore,
    Standing,
    newer_occurrence_due,
    sweep_misfired,
)

__all__ = [
    "DEFAULT_BINDING_TTL_S",
    "DEFAULT_MIN_LEAD",
    "Bindings",
    "BulkWriter",
    "CronHandle",
    "CronMessage",
    "CronService",
    "DailySchedule",
    "DjangoBeatTables",
    "DjangoBeatTask",
    "EntryRow",
    "FirstInstall",
    "InstalledRow",
    "PeriodicStore",
    "Standing",
    "config_hash",
    "copy_direct",
    "copy_record",
    "cron_key",
    "direct_record",
    "newer_occurrence_due",
    "parse_cron_key",
    "periodic_times",
    "prune_run_claims",
    "sweep_misfired",
    "validate_prefix",
]
