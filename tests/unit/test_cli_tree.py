"""Every command of ``delayq`` (plugins loaded), walked from click's tree: each one that lists
takes ``--json``, so a script never has to parse a table (docs/reference/cli.md, "Output in a
log"). A new command fails here until it has ``--json`` or is named below with the reason it
lists nothing."""

from __future__ import annotations

from collections.abc import Iterator

import click

from delayq_transport.cli.main import load_plugins, main

#: Commands that list nothing a program would read, and what they print instead.
NOT_LISTINGS = {
    "delayq migrate": "one line: the migrations applied",
    "delayq demo": "a live view for a person, then one summary line",
    "delayq web": "serves the page (its JSON API is the machine-readable side)",
    "delayq grants": "SQL statements, to be run as they are",
    "delayq metrics": "Prometheus' text format, itself machine-readable",
    "delayq beat add": "one line: the entry stored",
    "delayq beat remove": "one line: the entry removed",
    "delayq beat enable": "one line: the entry enabled",
    "delayq beat disable": "one line: the entry disabled",
    "delayq beat import": "an action: its table is the plan it applies (or, --dry-run, would)",
    "delayq queues pause": "one line: the queue paused",
    "delayq queues resume": "one line: the queue resumed",
    "delayq queues limit": "one line: the limits in force",
}


def leaf_commands() -> Iterator[tuple[str, click.Command]]:
    load_plugins()

    def walk(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
        if isinstance(command, click.Group):
            for name, sub in sorted(command.commands.items()):
                yield from walk(sub, f"{path} {name}")
        else:
            yield path, command

    return walk(main, "delayq")


def takes_json(command: click.Command) -> bool:
    return any(isinstance(p, click.Option) and "--json" in p.opts and p.is_flag
               for p in command.params)


def test_every_listing_command_takes_json() -> None:
    commands = dict(leaf_commands())
    assert {"delayq status", "delayq beat list", "delayq tasks list",
            "delayq tasks search-index", "delayq tasks dead-letters list"} <= set(commands)
    lacking = [path for path, command in commands.items()
               if path not in NOT_LISTINGS and not takes_json(command)]
    assert lacking == [], f"listing commands without --json: {lacking}"
    stale = sorted(set(NOT_LISTINGS) - set(commands))
    assert stale == [], f"NOT_LISTINGS names commands that do not exist: {stale}"
