"""How every ``delayq`` command fails: one line on stderr, and an exit status that tells what
kind of failure it was, so a deploy step or a script can branch on it (retry when the database
was away, run ``delayq migrate`` when the tables are missing) and a log keeps one greppable line
per failure while stdout keeps only what the command prints (a table, JSON).

:func:`fail` is the one place errors are written; :class:`.main.DelayqGroup` calls it for every
command, so no command prints its own errors. ``docs/reference/cli.md`` renders
:data:`EXIT_CODES`.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from ..core import DatabaseUnavailable, DelayqError, SchemaMissing

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NO_SCHEMA = 3
EXIT_UNAVAILABLE = 4

#: Exit status -> what it means (the CLI reference's table).
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "Done.",
    EXIT_ERROR: "Refused or failed, and trying again will not help: bad input, permission "
                "denied, a database error, a declined confirmation (`Aborted!`), a move that "
                "left messages in the source. The line says which.",
    EXIT_USAGE: "Usage: an unknown command or option, a missing or invalid argument (click's "
                "message, after the command's usage line).",
    EXIT_NO_SCHEMA: "The database has no delayq tables for `--table`, or they lack a "
                    "migration: run `delayq migrate` (see below: no other command creates "
                    "them).",
    EXIT_UNAVAILABLE: "The database could not be reached (host, port, name, credentials, "
                      "a failover in progress), or a server limit (`statement_timeout`, "
                      "`lock_timeout`) cancelled a statement: the same command may pass later.",
}


def exit_code(exc: BaseException) -> int:
    """The exit status for an error a command raised (:data:`EXIT_CODES`)."""
    if isinstance(exc, SchemaMissing):
        return EXIT_NO_SCHEMA
    if isinstance(exc, DatabaseUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(exc, click.ClickException):
        return exc.exit_code
    return EXIT_ERROR


def one_line(text: str) -> str:
    """A message on one line: the driver's messages carry newlines and runs of spaces (a
    server's ``FATAL:  ...`` then a tab-indented hint); lines are joined with ``; ``."""
    lines = (" ".join(line.split()) for line in text.splitlines())
    return "; ".join(line for line in lines if line) or "(no message)"


def fail(exc: DelayqError | click.ClickException) -> NoReturn:
    """Write ``error: <message>`` as one line on stderr and exit with the error's status."""
    message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
    click.echo(f"{click.style('error:', fg='red')} {one_line(message)}", err=True)
    sys.exit(exit_code(exc))
