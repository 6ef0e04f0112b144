"""Schema and migrations: what delayq creates in a database, and how it goes away again.

The declared tables (SQLAlchemy Core) and the numbered migrations that build them, applied
under one advisory lock (:mod:`.migrations`); the GRANTs of each least-privilege role
(:mod:`.grants`, ``delayq grants``); and ``delayq uninstall`` (:mod:`.uninstall`). Their
statements are ``schema.sql``: the migrations' ledger and lock, the DDL of migrations that is
not a declared table, the ``grant_*`` and ``uninstall_*`` blocks. Stands on :mod:`..db` only;
the queue (a layer up) checks the schema when it opens.
"""

from __future__ import annotations

from .grants import ROLE_PROFILES, grants_for
from .migrations import (
    DEFAULT_SCHEMA_WAIT_S,
    ENTRIES_TABLE,
    INSTALLED_TABLE,
    LOCK_BLOCKS,
    LOCK_MODES,
    MIGRATIONS,
    SCHEDULERS_TABLE,
    Migration,
    current_version,
    ensure_schema,
    migrate,
    missing_migrations,
    require_schema,
    set_unlogged,
    wait_for_schema,
)
from .uninstall import UninstallPlan, UninstallRefused, plan_uninstall, uninstall

__all__ = [
    "DEFAULT_SCHEMA_WAIT_S",
    "ENTRIES_TABLE",
    "INSTALLED_TABLE",
    "LOCK_BLOCKS",
    "LOCK_MODES",
    "MIGRATIONS",
    "ROLE_PROFILES",
    "SCHEDULERS_TABLE",
    "Migration",
    "UninstallPlan",
    "UninstallRefused",
    "current_version",
    "ensure_schema",
    "grants_for",
    "migrate",
    "missing_migrations",
    "plan_uninstall",
    "require_schema",
    "set_unlogged",
    "wait_for_schema",
    "uninstall",
]
