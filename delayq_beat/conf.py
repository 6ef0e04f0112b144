"""Celery beat's delayq settings (``app.conf``) declared once, and the engine's per-entry options.

The scheduler reads every setting through :data:`BEAT_SETTINGS`, and
``docs/reference/beat-settings.md`` is rendered from it (``python docs/_gen/reference.py``).
"""

from __future__ import annotations

from typing import Any

from delayq_transport.core.queue import Option, Options
from delayq_transport.scheduling.entries import ENTRY_OPTIONS

from .entries import DEFAULT_GRACE_S, DEFAULT_MISFIRE, MISFIRE_POLICIES
from .installer import Settings

#: Most connections beat's pool opens (on first use): a refresh runs one statement at a time.
DEFAULT_POOL_SIZE = 2

_DEFAULTS = Settings()

BEAT_SETTINGS = Options(
    Option("delayq_beat_refresh_interval", _DEFAULTS.refresh_interval.total_seconds(),
           "seconds or timedelta",
           "How often entries are re-read and their coming occurrences installed."),
    Option("delayq_beat_horizon", _DEFAULTS.horizon.total_seconds(), "seconds or timedelta",
           "How far ahead occurrences are installed: at least five refresh intervals (a handover "
           "between two configurations leaves no hole), and each "
           "entry always gets at least `delayq_beat_min_occurrences`."),
    Option("delayq_beat_min_occurrences", _DEFAULTS.min_occurrences, "int",
           "Occurrences installed per entry at least (a daily crontab is installed 3 days "
           "ahead by default)."),
    Option("delayq_beat_misfire", DEFAULT_MISFIRE, " | ".join(f"`{p}`" for p in MISFIRE_POLICIES),
           "Default misfire policy of the entries (per entry: option `delayq_misfire`)."),
    Option("delayq_beat_misfire_grace", DEFAULT_GRACE_S, "seconds",
           "Default time an occurrence may wait past its due time before it counts as "
           "misfired (per entry: option `delayq_grace`)."),
    Option("delayq_beat_database_url", None, "libpq URL",
           "The database holding the queue table. Beat opens no broker connection.",
           shown="`broker_write_url` or `broker_url`"),
    Option("delayq_beat_table", None, "identifier", "The queue table.",
           shown="`broker_transport_options['table']`, else `delayed_queue`"),
    Option("delayq_beat_pool_size", DEFAULT_POOL_SIZE, "connections",
           "Most database connections beat opens (on first use; one in practice)."),
    Option("delayq_beat_source", None, "`django-celery-beat`",
           "Where entries are edited besides `beat_schedule` and delayq's own: "
           "`django-celery-beat` reads its tables (in the beat's database) at every refresh, "
           "so the Django admin stays the editing UI; workers write each run's "
           "`last_run_at` and `total_run_count` back and disable a one-off once it ran.",
           shown="none"),
    Option("delayq_beat_check_tasks", True, "bool",
           "Refuse an entry whose task the app has not registered (only a warning when the "
           "app registers no task of its own). False turns the check off."),
)

__all__ = ["BEAT_SETTINGS", "DEFAULT_POOL_SIZE", "ENTRY_OPTIONS", "setting"]


def setting(app: Any, name: str) -> Any:
    """``app.conf[name]``, or its declared default when unset (or None)."""
    return BEAT_SETTINGS.read(app.conf, name)
