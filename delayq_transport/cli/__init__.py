"""The ``delayq`` command (:mod:`.main`), its demo (:mod:`.demo`, :mod:`.demo_app`) and the
embedded PostgreSQL the demo starts when no database is configured (:mod:`.embedded`).

Sibling packages add sub-commands through the registry below them,
:mod:`delayq_transport.commands` (``register``, ``Context``, ``console``, ``STATUS_HOOKS``,
re-exported here for code written against this package); :class:`.main.DelayqGroup` imports
their command modules when one of their commands is asked for.
"""

from __future__ import annotations

from .main import STATUS_HOOKS, Context, console, main, register

__all__ = ["STATUS_HOOKS", "Context", "console", "main", "register"]

