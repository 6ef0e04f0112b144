"""The ``delayq`` command: schema, status, and the demo.

The database URL comes from ``--database-url`` or ``DELAYQ_DATABASE_URL``; sibling packages add
their own sub-commands (``delayq beat ...``, ``delayq spark-report``) through the registry below
them (:mod:`delayq_transport.commands`), which this group reads.
"""

from __future__ import annotations

import importlib

import click

from ..commands import COMMANDS, DEFAULT_POOL_SIZE, STATUS_HOOKS, Context, console, register
from ..core import DelayqError, validate_table_name
from ..core.db import Database, mask_password
from ..core.integrations import PeriodicStore
from ..core.schema import MIGRATIONS, migrate
from .errors import fail
from .status import run_status, status_options

__all__ = ["STATUS_HOOKS", "Context", "console", "load_plugins", "main", "register"]

#: Who may create or change delayq's schema, and why only they (the CLI reference renders it).
SCHEMA_WRITERS: dict[str, str] = {
    "`delayq migrate`": "Creates the tables, or applies the missing migrations; the release "
                        "step, as the role that owns the tables.",
    "what uses the queue: Celery workers, producers and beat, Django, the Dramatiq broker, "
    "Spark jobs that write, the Python API (`DelayedQueue`)": "On first use, read the "
        "migrations ledger and apply what is missing if their role may run DDL "
        "(`ensure_schema=False` turns this off); otherwise a worker waits for `delayq "
        "migrate` and anything else refuses, naming it ([a worker before `delayq migrate`]"
        "(../how-to/upgrade.md#a-worker-before-delayq-migrate)): an upgrade then needs no "
        "separate step where one role does everything.",
    "`delayq demo`": "Only tables of its own (`delayq_demo` and its companions), never the "
                     "queue table of `--table`.",
    "every other `delayq` command": "Never: they check the ledger first and exit 3 with "
        "\"no delayq tables in database 'NAME': run `delayq migrate`\". A command that only "
        "reads (`status`, `beat list`, `tasks list`, `metrics`, ...) run against the wrong "
        "database must not leave tables there, and a role that may not run DDL gets that line "
        "instead of a PostgreSQL error.",
}

#: Sub-commands that live in plugin modules, and the modules that provide them (a listing hook
#: rides with its command: Dramatiq's periodic actors join ``delayq beat list``). A module is
#: imported only when its command runs or the commands are listed (``delayq --help``), so
#: ``delayq status`` and ``delayq migrate`` start without Celery, Starlette or pyspark.
LAZY_COMMANDS: dict[str, tuple[str, ...]] = {
    "beat": ("delayq_beat.cli", "delayq_transport.dramatiq.ledger"),
    "demo": ("delayq_transport.cli.demo",),
    "grants": ("delayq_transport.cli.ops",),
    "metrics": ("delayq_transport.cli.ops",),
    "move-from": ("delayq_transport.move.cli",),
    "queues": ("delayq_transport.cli.queues",),
    "tasks": ("delayq_transport.cli.tasks",),
    "uninstall": ("delayq_transport.cli.ops",),
    "web": ("delayq_transport.web.cli",),
    "spark-report": ("delayq_transport.spark.cli",),
}

#: Every plugin module, in the order they are loaded when all are wanted.
PLUGIN_MODULES = tuple(dict.fromkeys(m for mods in LAZY_COMMANDS.values() for m in mods))

#: Modules whose hooks add sections to ``delayq status`` when the table has periodic entries.
STATUS_PLUGIN_MODULES = ("delayq_beat.cli",)


class DelayqGroup(click.Group):
    """Turns delayq errors into one line on stderr and their exit status instead of a
    traceback (:func:`.errors.fail`, for every command), and imports a plugin's module only
    when one of its commands is asked for (start-up time: the whole ``delayq status`` process
    has a budget of 1 s, most of it Python imports)."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            load_plugins(LAZY_COMMANDS.get(cmd_name, ()))
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        load_plugins()
        return super().list_commands(ctx)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError:
            raise  # click prints the usage line with it, exit status 2
        except (DelayqError, click.ClickException) as exc:
            fail(exc)


@click.group(cls=DelayqGroup)
@click.option("--database-url", "-d", envvar="DELAYQ_DATABASE_URL", default=None,
              help="postgresql://user@host:port/db (env: DELAYQ_DATABASE_URL)")
@click.option("--table", default="delayed_queue", show_default=True, envvar="DELAYQ_TABLE",
              help="Queue table name (env: DELAYQ_TABLE)")
@click.option("--pool-size", default=DEFAULT_POOL_SIZE, show_default=True,
              envvar="DELAYQ_POOL_SIZE", type=click.IntRange(1, 100),
              help="Most database connections this command opens (env: DELAYQ_POOL_SIZE)")
@click.pass_context
def main(ctx: click.Context, database_url: str | None, table: str, pool_size: int) -> None:
    """delayq: a PostgreSQL-backed delayed queue for Celery."""
    try:
        validate_table_name(table)
    except DelayqError as exc:
        raise click.BadParameter(str(exc), param_hint="--table") from exc
    ctx.obj = Context(database_url, table, pool_size)


@main.command("migrate")
@click.pass_obj
def migrate_cmd(obj: Context) -> None:
    """Create or upgrade the schema (idempotent, safe to run concurrently)."""
    with Database(obj.require_url()) as db:
        applied = migrate(db, obj.table)
    latest = max(m.version for m in MIGRATIONS)
    where = mask_password(obj.require_url())
    if applied:
        console.print(f"applied migrations {applied} to {obj.table} on {where}")
    else:
        console.print(f"{obj.table} on {where} is up to date (version {latest})")


@main.command("status")
@status_options
@click.pass_obj
def status_cmd(obj: Context, as_json: bool, exact: bool, cap: int) -> None:
    """Per queue/kind: due, scheduled, in flight, redelivered, lag, next due; then what holds
    back cleanup, dead tuples and bloat, with warnings (thresholds: docs/how-to/monitor.md)."""
    with obj.queue() as queue:
        if not as_json:  # the URL as the worker banner shows it, password masked (issue 26)
            console.print(f"database {mask_password(queue.db.url)}", style="dim", markup=False,
                          highlight=False, soft_wrap=True)
            if PeriodicStore(queue.db, obj.table).in_use():
                load_plugins(STATUS_PLUGIN_MODULES)
        run_status(console, queue, obj.table, as_json=as_json, exact=exact, cap=cap,
                   hooks=STATUS_HOOKS, obj=obj)


def load_plugins(modules: tuple[str, ...] = PLUGIN_MODULES) -> None:
    """Import plugin modules (all by default); each registers its commands and hooks
    (:mod:`delayq_transport.commands`), and every command registered so far joins ``main``."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
    for name, command in COMMANDS.items():
        if name not in main.commands:
            main.add_command(command)
