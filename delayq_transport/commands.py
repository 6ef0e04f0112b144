"""The registry of the ``delayq`` command's sub-commands, below the packages that add them.

The command itself (:mod:`delayq_transport.cli`) is the composition root: it imports a
package's command module when one of its commands is asked for (``LAZY_COMMANDS``). The
modules it imports (``web/cli.py``, ``move/cli.py``, ``spark/cli.py``, ``delayq_beat/cli.py``,
its own ``cli/ops.py``, ...) import only this module to join: :func:`register` a command,
append a section to :data:`STATUS_HOOKS`, take the :class:`Context` every command is handed
and print on the one :data:`console`. So no adapter imports the CLI above it.
"""

from __future__ import annotations

from typing import Any

import click

from .core.db import Database
from .core.queue import DelayedQueue
from .core.schema import require_schema
from .output import CliConsole

#: Where every sub-command prints everything but JSON (errors go to stderr: cli/errors.py).
console = CliConsole()

#: Most connections ``delayq`` opens (``delayq web`` serves requests on several threads).
DEFAULT_POOL_SIZE = 8

#: Sub-commands registered by their modules, by name, in registration order.
COMMANDS: dict[str, click.Command] = {}

#: Extra sections for ``delayq status`` (beat adds its next occurrences per entry).
STATUS_HOOKS: list[Any] = []


def register(command: click.Command) -> None:
    """Add a sub-command to ``delayq`` (the first registration of a name wins)."""
    if command.name is None:
        raise ValueError("a delayq sub-command needs a name")
    COMMANDS.setdefault(command.name, command)


class Context:
    """What every sub-command is handed (``@click.pass_obj``): the global options."""

    def __init__(self, database_url: str | None, table: str,
                 pool_size: int = DEFAULT_POOL_SIZE) -> None:
        self.database_url = database_url
        self.table = table
        self.pool_size = pool_size

    def require_url(self) -> str:
        if not self.database_url:
            raise click.UsageError("no database: pass --database-url or set DELAYQ_DATABASE_URL")
        return self.database_url

    def queue(self) -> DelayedQueue:
        """The table's queue on a pool that opens connections on first use, up to
        ``--pool-size`` (the queue closes it). Checks the schema and never creates it
        (``SCHEMA_WRITERS`` in cli/main.py): only ``delayq migrate`` does."""
        db = Database(self.require_url(), min_size=0, max_size=self.pool_size)
        try:
            require_schema(db, self.table)
            return DelayedQueue(db, table=self.table, ensure_schema=False,
                                owns_database=True)
        except BaseException:
            db.close()  # a failure before the queue took it over
            raise

    def require_schema(self) -> None:
        """The check of :meth:`queue` for a command that reads the table another way (Spark)."""
        with Database(self.require_url(), min_size=0, max_size=1) as db:
            require_schema(db, self.table)
