"""``delayq beat import``: the command (see :mod:`.imports` for what it does, :mod:`.sources`
for where it reads), added to ``delayq beat`` by :mod:`.cli` with its console."""

from __future__ import annotations

from collections import Counter
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from delayq_transport.core import InvalidInput
from delayq_transport.scheduling.schedules import describe

from . import imports
from .sources import open_source
from .store import BeatStore

SOURCE_HELP = ("django-celery-beat (LOCATION: its database URL or libpq string, default the "
               "-d database), redbeat (LOCATION: its Redis URL), a celerybeat-schedule file, "
               "or a Celery app (module:attribute)")


def plan_table(plan: imports.Plan) -> Table:
    table = Table(title=f"import from {plan.source.kind} ({plan.source.where}); times UTC")
    for col in ("entry", "action", "on", "task / schedule", "next", "notes"):
        table.add_column(col)
    for step in plan.steps:
        entry = step.entry
        notes = [step.reason] if step.reason else []
        if entry is not None:
            notes += list(entry.notes)
        if step.disable_source and entry is not None:
            notes.append(f"disabled in {plan.source.kind}")
        what = f"{entry.task} {describe(entry.definition())}" if entry is not None else "-"
        on = "-" if entry is None else ("yes" if entry.enabled else "no")
        runs = "\n".join(f"{t:%Y-%m-%d %H:%M:%S}" for t in step.next_runs) or "-"
        style = "red" if step.action == "refused" else None
        table.add_row(step.name, step.action, on, what, runs, "; ".join(notes), style=style)
    return table


def import_command(console: Console) -> click.Command:
    """The command, printing to ``console`` (the ``delayq`` CLI's)."""
    _out[0] = console
    return import_cmd


_out: list[Console] = [Console()]


@click.command("import")
@click.option("--from", "source_kind", required=True, metavar="SOURCE", help=SOURCE_HELP)
@click.argument("location", required=False)
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing")
@click.option("--disable-source", is_flag=True,
              help="Disable each imported entry in its source (django-celery-beat, redbeat)")
@click.option("--undo", is_flag=True, help="Remove the entries imported from this source, "
              "uninstall their occurrences, re-enable the source entries the import disabled")
@click.option("--exclude", multiple=True, metavar="NAME",
              help="Leave this entry in the source only (repeatable)")
@click.option("--tz", help="The source app's timezone, for crontabs without their own "
              "(default: the app's or the schedule file's; needed for redbeat crontabs)")
@click.option("--schema", help="django-celery-beat: the schema of its tables (default: the "
              "search_path's)")
@click.option("--redbeat-prefix", default="redbeat:", show_default=True,
              help="redbeat: its key prefix (redbeat_key_prefix)")
@click.pass_obj
def import_cmd(obj: Any, source_kind: str, location: str | None, dry_run: bool,
               disable_source: bool, undo: bool, exclude: tuple[str, ...], tz: str | None,
               schema: str | None, redbeat_prefix: str) -> None:
    """Import another scheduler's entries as DB-backed entries, all or none (idempotent)."""
    source = open_source(source_kind, location, database_url=obj.database_url, zone=tz,
                         schema=schema, redbeat_prefix=redbeat_prefix)
    try:
        if disable_source and source.cannot_disable:
            raise InvalidInput(f"--disable-source: {source.cannot_disable}")
        queue = obj.queue()
        with queue:
            store = BeatStore(queue.db, obj.table, ensure_schema=False)  # checked by queue()
            if undo:
                _undo(source, queue, store, dry_run)
            else:
                _import(source, store, dry_run, disable_source, exclude)
    finally:
        source.close()


def _import(source: imports.Source, store: BeatStore, dry_run: bool, disable_source: bool,
            exclude: tuple[str, ...]) -> None:
    plan = imports.plan(source, store, disable_source=disable_source, exclude=exclude)
    _out[0].print(plan_table(plan))
    counts = Counter(s.action for s in plan.steps)
    summary = ", ".join(f"{n} {a}" for a, n in sorted(counts.items())) or "no entries"
    if plan.refused:
        raise InvalidInput(f"{len(plan.refused)} entr{'y' if len(plan.refused) == 1 else 'ies'}"
                           f" refused ({summary}): nothing imported. Fix them in the source, or "
                           "leave them there with --exclude NAME")
    if dry_run:
        _out[0].print(f"dry run: {summary}; to disable in {source.kind}: "
                      f"{', '.join(plan.to_disable) or 'none'}")
        return
    disabled = imports.apply(plan, store)
    _out[0].print(f"imported: {summary}; disabled in {source.kind}: "
                  f"{', '.join(disabled) or 'none'}")


def _undo(source: imports.Source, queue: object, store: BeatStore, dry_run: bool) -> None:
    todo = imports.plan_undo(source, store)
    verb = "would remove" if dry_run else "removed"
    if not dry_run:
        imports.undo(source, queue, store, todo)  # type: ignore[arg-type]
    _out[0].print(f"{verb} {len(todo.entries)} entries imported from {source.kind}: "
                  f"{', '.join(todo.entries) or 'none'}")
    if todo.uninstalled:
        _out[0].print(f"uninstalled their waiting occurrences: "
                      f"{sum(todo.uninstalled.values())}")
    _out[0].print(f"{'would re-enable' if dry_run else 're-enabled'} in {source.kind}: "
                  f"{', '.join(todo.reenable) or 'none'}")
    if todo.ran_here:
        _out[0].print(f"left disabled in {source.kind} (one-offs that ran under delayq): "
                      f"{', '.join(todo.ran_here)}")
