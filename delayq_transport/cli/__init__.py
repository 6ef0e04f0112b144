"""The ``delayq`` command (:mod:`.main`), its demo (:mod:`.demo`, :mod:`.demo_app`) and the
embedded PostgreSQL the demo starts when no database is configured (:mod:`.embedded`).

Sibling packages add sub-commands with :func:`register`; :class:`.main.DelayqGroup` imports
them when one of their commands is asked for, so a plugin can import ``delayq_transport.cli``.
"""

from __future__ import annotations

from .main import STATUS_HOOKS, Context, console, main, register

__all__ = ["STATUS_HOOKS", "Context", "console", "main", "register"]

