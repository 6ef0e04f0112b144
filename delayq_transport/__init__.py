"""delayq: a PostgreSQL-backed delayed queue, with a kombu transport for Celery.

Layout, one folder per concept:

* :mod:`delayq_transport.core`: ``DelayedQueue``, ``CronService``, the database boundary, the
  schema and migrations, and every SQL statement, in parts (db, schema, queue, inspect,
  ledgers, integrations). It imports no adapter.
* :mod:`delayq_transport.transport`: the kombu transport (``delayq+postgresql://``).
* :mod:`delayq_transport.spark`: scheduling from and reading into Spark DataFrames.
* :mod:`delayq_transport.cli`: the ``delayq`` command, its demo and the embedded PostgreSQL.

Importing this package registers the ``delayq`` scheme with kombu (the one step next to
``broker_url``) and re-exports the core's public API.
"""

from __future__ import annotations

# ruff: noqa: E402
from kombu.transport import TRANSPORT_ALIASES

#: Schemes kombu resolves to delayq's transport. ``delayq`` is what kombu keeps of a first URL
#: ``delayq+postgresql://...`` (it splits at ``+``); the full schemes are what its failover
#: path (``Connection.switch``) looks up for every alternate URL, parsed whole.
TRANSPORT_SCHEMES = ("delayq", "delayq+postgresql", "delayq+postgres")

# The one step next to ``broker_url``: importing delayq teaches kombu the ``delayq+`` scheme.
for _scheme in TRANSPORT_SCHEMES:
    TRANSPORT_ALIASES.setdefault(_scheme, "delayq_transport.transport:Transport")

# The public API is the core's; its __all__ is the one list of names (kept in core/__init__).
from .core import *  # noqa: F403
from .core import __all__ as __all__

__version__ = "0.1.0"
