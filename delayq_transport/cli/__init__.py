"""The ``delayq`` command (:mod:`.main`), its demo (:mod:`.demo`, :mod:`.demo_app`) and the
embedded PostgreSQL the demo starts when no database is configured (:mod:`.embedded`).

Sibling packages add sub-commands with :func:`register`; they are imported here, once this
package is complete, so a plugin can import ``delayq_transport.cli`` itself.
"""

from __future__ import annotations

from .main import STATUS_HOOKS, Context, console, load_plugins, main, register

__all__ = ["STATUS_HOOKS", "Context", "console", "main", "register"]

load_plugins()
