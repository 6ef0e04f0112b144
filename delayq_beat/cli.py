"""``delayq beat list|add|remove|enable|disable`` and the beat section of ``delayq status``.

Loaded by ``delayq_transport.cli`` when ``delayq beat`` runs, when the commands are listed,
and by ``delayq status`` when the table has beat entries (``LAZY_COMMANDS``,
``STATUS_PLUGIN_MODULES``); the beat tables themselves are the core's migration 10. ``delayq
beat list`` also shows the ledgers of other front ends' periodic entries
(:func:`~delayq_transport.browse.beat.periodic_ledgers`: Dramatiq's periodic actors,
django.tasks' periodic tasks).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from rich.table import Table

from delayq_transport.browse.beat import periodic_ledgers, with_task
from delayq_transport.commands import STATUS_HOOKS, Context, console, register
from delayq_transport.core import InvalidInput
from delayq_transport.core.queue import DelayedQueue, from_ms, to_ms
from delayq_transport.formats.celery import queue_of_kind
from delayq_transport.output import emit, json_option
from delayq_transport.scheduling.djbeat import listing_fields
from delayq_transport.scheduling.entries import instant
from delayq_transport.scheduling.listing import ListedEntry, list_entries
from delayq_transport.scheduling.schedules import Clocked, Solar, parse_crontab
from delayq_transport.scheduling.store import EntryStore

from .import_cmd import import_command
from .source_changes import ADVICE, Change, marks
from .store import BeatStore

NEXT_SHOWN = 3


@click.group("beat")
def beat_group() -> None:
    """DB-backed beat entries and installed occurrences (delayq_beat.Scheduler)."""


def _store(obj: Context) -> tuple[DelayedQueue, BeatStore]:
    queue = obj.queue()  # checks the schema; nothing here creates it
    return queue, BeatStore(queue.db, obj.table, ensure_schema=False)


def _fmt(ms: int, fmt: str = "%m-%d %H:%M:%S") -> str:
    return from_ms(ms).strftime(fmt)


def _queue_text(kind: str) -> str:
    queue, priority = queue_of_kind(kind)
    return f"{queue} p{priority}" if priority else queue


def _listed(queue: DelayedQueue, store: EntryStore, shown: int) -> list[ListedEntry]:
    """The entries of ``store``; those a beat in admin mode installed from django-celery-beat's
    tables (in this database) show that origin and the admin's fields, which the ledger does
    not keep."""
    return list_entries(queue, store, shown, sources=listing_fields(queue.db, store.table))


def entries_table(entries: list[ListedEntry], shown: int = NEXT_SHOWN,
                  title: str = "beat entries (times UTC)",
                  changed: Mapping[str, Change] | None = None) -> Table:
    """Every known entry (DB-backed or installed by a beat) and its next installed occurrences;
    ``changed``: imported entries whose source entry changed since (a column of their own)."""
    table = Table(title=title)
    for col in ("entry", "origin", "on", "task / schedule", "hash", "queue",
                f"next {shown} (installed)"):
        table.add_column(col)
    if changed:
        table.add_column("source changed")
    for e in entries:
        upcoming = "\n".join(f"{_fmt(r.scheduled_at_initially_ms)} "
                             f"({_fmt(r.created_at_ms, '%H:%M:%S')})"
                             for r in e.upcoming) or "-"
        where = ((e.config_hash[:8], _queue_text(e.kind)) if e.config_hash and e.kind
                 else ("-", "-"))
        marker = [changed[e.name].short if e.name in changed else "-"] if changed else []
        table.add_row(e.name, e.origin, "yes" if e.enabled else "no",
                      f"{e.task} {e.schedule}".strip(), *where,
                      upcoming if e.config_hash else "-", *marker)
    return table


def entry_document(e: ListedEntry) -> dict[str, Any]:
    """One entry as ``--json`` prints it: instants in ISO-8601 UTC."""
    queue, priority = queue_of_kind(e.kind) if e.kind else (None, None)
    return {"name": e.name, "origin": e.origin, "enabled": e.enabled, "task": e.task or None,
            "schedule": e.schedule or None, "config_hash": e.config_hash, "kind": e.kind,
            "queue": queue, "priority": priority,
            "upcoming": [{"at": from_ms(r.scheduled_at_initially_ms).isoformat(),
                          "installed_at": from_ms(r.created_at_ms).isoformat()}
                         for r in e.upcoming] if e.config_hash else []}


@beat_group.command("list")
@click.option("--next", "shown", default=NEXT_SHOWN, show_default=True,
              help="Occurrences shown per entry")
@json_option
@click.pass_obj
def list_cmd(obj: Context, shown: int, as_json: bool) -> None:
    """Entries with their next occurrences and when each was installed (createdAt)."""
    queue, store = _store(obj)
    with queue:
        changed = marks(queue.db, store)
        listings = {"beat entries": _listed(queue, store, shown)}
        for namespace, title in periodic_ledgers().items():
            other = EntryStore(queue.db, obj.table, namespace=namespace, ensure_schema=False)
            if other.installed():
                listings[title] = [with_task(e) for e in _listed(queue, other, shown)]
    if as_json:
        emit({"entries": [dict(entry_document(e), source_changed=str(changed[e.name])
                               if e.name in changed else None)
                          for e in listings.pop("beat entries")],
              "ledgers": {title: [entry_document(e) for e in entries]
                          for title, entries in listings.items()}})
        return
    console.print(entries_table(listings.pop("beat entries"), shown, changed=changed))
    for change in changed.values():
        console.print(str(change), soft_wrap=True, markup=False, highlight=False)
    if changed:
        console.print(ADVICE, soft_wrap=True, markup=False, highlight=False)
    for title, entries in listings.items():
        console.print(entries_table(entries, shown, f"{title} (times UTC)"))


def _json_arg(text: str | None, what: str, kind: type) -> Any:
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"--{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, kind):
        raise InvalidInput(f"--{what} must be a JSON {kind.__name__}, got {text!r}")
    return value


def _schedule(every: float | None, cron: str | None, solar: str | None,
              at: str | None) -> Any:
    given = [x for x in (every, cron, solar, at) if x is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --every, --crontab, --solar, --at")
    if every is not None:
        return timedelta(seconds=every)
    if at is not None:
        return Clocked(to_ms(instant(at, "--at") or datetime.now(UTC)))
    if cron is not None:
        return parse_crontab(cron)
    event, _, where = str(solar).partition(":")
    lat, _, lon = where.partition(",")
    try:
        return Solar(event, float(lat), float(lon))
    except ValueError as exc:
        raise InvalidInput(f"--solar {solar!r}: expected EVENT:LAT,LON ({exc})") from exc


@beat_group.command("add")
@click.argument("name")
@click.argument("task")
@click.option("--every", type=float, help="Interval in seconds (aligned to the epoch)")
@click.option("--crontab", "cron", help='"minute hour day-of-month month day-of-week"')
@click.option("--solar", help="EVENT:LAT,LON, e.g. sunrise:40.7,-74.0 (needs ephem)")
@click.option("--at", help="One instant (ISO-8601 with its offset): a one-off entry")
@click.option("--tz", help="The entry's own time zone for --crontab (default: the app's)")
@click.option("--anchor", help="--every counts from: epoch (default), first_install, or a time")
@click.option("--start", help="No occurrence before this time (ISO-8601 with its offset)")
@click.option("--end", help="No occurrence at or after this time (ISO-8601 with its offset)")
@click.option("--one-off", is_flag=True, help="Run the first occurrence only")
@click.option("--args", "args_json", help="JSON list of positional arguments")
@click.option("--kwargs", "kwargs_json", help="JSON object of keyword arguments")
@click.option("--options", "options_json", help="JSON object of apply_async options")
@click.option("--queue", help="Queue (default: task_default_queue of the beat's app)")
@click.option("--priority", type=click.IntRange(0, 9), help="Message priority (0 is served first)")
@click.option("--expires", type=float, help="Seconds after each occurrence")
@click.option("--misfire", type=click.Choice(["coalesce", "run_all", "skip"]),
              help="Misfire policy (default: the beat's delayq_beat_misfire)")
@click.option("--grace", type=float, help="Seconds late before an occurrence misfired")
@click.option("--disabled", is_flag=True, help="Store it disabled")
@click.pass_obj
def add_cmd(obj: Context, name: str, task: str, every: float | None, cron: str | None,
            solar: str | None, at: str | None, tz: str | None, anchor: str | None,
            start: str | None, end: str | None, one_off: bool, args_json: str | None,
            kwargs_json: str | None, options_json: str | None, queue: str | None,
            priority: int | None, expires: float | None, misfire: str | None,
            grace: float | None, disabled: bool) -> None:
    """Add or replace a DB-backed entry (running beats pick it up within one refresh)."""
    options = _json_arg(options_json, "options", dict)
    extra = {"queue": queue, "priority": priority, "expires": expires,
             "delayq_misfire": misfire, "delayq_grace": grace, "delayq_tz": tz,
             "delayq_anchor": anchor, "delayq_start_time": start, "delayq_expires": end,
             "delayq_one_off": one_off or None}
    options.update({k: v for k, v in extra.items() if v is not None})
    sched = _schedule(every, cron, solar, at)
    dq, store = _store(obj)
    with dq:
        store.add(name, task, sched, _json_arg(args_json, "args", list),
                  _json_arg(kwargs_json, "kwargs", dict), options, enabled=not disabled)
    console.print(f"entry {name!r} stored ({'disabled' if disabled else 'enabled'})")


@beat_group.command("remove")
@click.argument("name")
@click.pass_obj
def remove_cmd(obj: Context, name: str) -> None:
    """Remove a DB-backed entry; beats uninstall its occurrences at their next refresh."""
    dq, store = _store(obj)
    with dq:
        if not store.remove(name):
            raise InvalidInput(f"no DB-backed entry or override named {name!r}")
    console.print(f"entry {name!r} removed")


def _set_enabled(obj: Context, name: str, enabled: bool) -> None:
    dq, store = _store(obj)
    with dq:
        known = {e.name for e in store.entries()} | {i.name for i in store.installed()}
        if name not in known:
            raise InvalidInput(f"unknown beat entry {name!r} (see `delayq beat list`)")
        is_db = store.set_enabled(name, enabled)
    what = "entry" if is_db else "beat_schedule entry (override stored)"
    console.print(f"{what} {name!r} {'enabled' if enabled else 'disabled'}")


@beat_group.command("enable")
@click.argument("name")
@click.pass_obj
def enable_cmd(obj: Context, name: str) -> None:
    """Enable an entry (DB-backed, or a beat_schedule entry disabled earlier)."""
    _set_enabled(obj, name, True)


@beat_group.command("disable")
@click.argument("name")
@click.pass_obj
def disable_cmd(obj: Context, name: str) -> None:
    """Disable an entry: its future occurrences are uninstalled at the next refresh."""
    _set_enabled(obj, name, False)


def status_section(obj: Context) -> None:
    """``delayq status``: the beat entries, if any beat ever ran against this table."""
    queue, store = _store(obj)
    with queue:
        if store.entries() or store.installed():
            console.print(entries_table(_listed(queue, store, NEXT_SHOWN)))


beat_group.add_command(import_command(console))
register(beat_group)
if status_section not in STATUS_HOOKS:
    STATUS_HOOKS.append(status_section)
