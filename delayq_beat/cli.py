"""``delayq beat list|add|remove|enable|disable`` and the beat section of ``delayq status``.

Loaded by ``delayq_transport.cli`` when ``delayq beat`` runs, when the commands are listed,
and by ``delayq status`` when the table has beat entries (``LAZY_COMMANDS``,
``STATUS_PLUGIN_MODULES``); the beat tables themselves are the core's migration 10.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import click
from rich.table import Table

from delayq_transport.cli import STATUS_HOOKS, Context, console, register
from delayq_transport.core.cron import CronService
from delayq_transport.core.errors import InvalidInput
from delayq_transport.core.queue import DelayedQueue
from delayq_transport.core.timeutil import from_ms
from delayq_transport.transport.message import queue_of_kind

from .entries import key_prefix, parse_crontab, schedule_from_json
from .store import BeatStore

NEXT_SHOWN = 3
#: Extra listings ``delayq beat list`` prints after Celery's entries (other schedulers that
#: install through delayq_beat, e.g. Dramatiq's periodic actors): ``hook(queue, shown)``.
LIST_HOOKS: list[Callable[[DelayedQueue, int], Table | None]] = []


@click.group("beat")
def beat_group() -> None:
    """DB-backed beat entries and installed occurrences (delayq_beat.Scheduler)."""


def _store(obj: Context) -> tuple[DelayedQueue, BeatStore]:
    queue = obj.queue()
    return queue, BeatStore(queue.db, obj.table)


def _fmt(ms: int, fmt: str = "%m-%d %H:%M:%S") -> str:
    return from_ms(ms).strftime(fmt)


def _queue_text(kind: str) -> str:
    queue, priority = queue_of_kind(kind)
    return f"{queue} p{priority}" if priority else queue


def _schedule_text(definition: Mapping[str, Any] | None) -> str:
    if not definition:
        return ""
    sched = definition.get("schedule") or {}
    if sched.get("type") == "every":
        return f"every {sched.get('seconds')}s"
    if sched.get("type") == "crontab":
        fields = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        return "crontab " + " ".join(str(sched.get(f, "*")) for f in fields)
    return f"solar {sched.get('event')} {sched.get('lat')},{sched.get('lon')}"


def entries_table(queue: DelayedQueue, store: BeatStore, shown: int = NEXT_SHOWN,
                  title: str = "beat entries (times UTC)") -> Table:
    """Every known entry (DB-backed or installed by a beat) and its next installed occurrences."""
    stored = {e.name: e for e in store.entries()}
    installed = {i.name: i for i in store.installed()}
    table = Table(title=title)
    for col in ("entry", "origin", "on", "task / schedule", "hash", "queue",
                f"next {shown} (installed)"):
        table.add_column(col)
    for name in sorted(set(stored) | set(installed)):
        row, inst = stored.get(name), installed.get(name)
        origin = "db" if row and row.definition else "config"
        task = (row.definition or {}).get("task", "") if row else ""
        what = f"{task} {_schedule_text(row.definition if row else None)}".strip()
        upcoming = "-"
        if inst is not None:
            rows = CronService(queue.with_kind(inst.kind)).installed(
                key_prefix(name), shown, config_hash=inst.config_hash)
            upcoming = "\n".join(f"{_fmt(r.scheduled_at_initially_ms)} "
                                 f"({_fmt(r.created_at_ms, '%H:%M:%S')})"
                                 for r in rows) or "-"
        where = (inst.config_hash[:8], _queue_text(inst.kind)) if inst else ("-", "-")
        table.add_row(name, origin, "no" if row and not row.enabled else "yes", what,
                      *where, upcoming)
    return table


@beat_group.command("list")
@click.option("--next", "shown", default=NEXT_SHOWN, show_default=True,
              help="Occurrences shown per entry")
@click.pass_obj
def list_cmd(obj: Context, shown: int) -> None:
    """Entries with their next occurrences and when each was installed (createdAt)."""
    queue, store = _store(obj)
    with queue:
        console.print(entries_table(queue, store, shown))
        for hook in LIST_HOOKS:
            extra = hook(queue, shown)
            if extra is not None:
                console.print(extra)


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


def _schedule(every: float | None, cron: str | None, solar: str | None) -> Any:
    given = [x for x in (every, cron, solar) if x is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --every, --crontab, --solar")
    if every is not None:
        return timedelta(seconds=every)
    if cron is not None:
        return parse_crontab(cron)
    event, _, where = str(solar).partition(":")
    lat, _, lon = where.partition(",")
    return schedule_from_json({"type": "solar", "event": event, "lat": lat, "lon": lon})


@beat_group.command("add")
@click.argument("name")
@click.argument("task")
@click.option("--every", type=float, help="Interval in seconds (aligned to the epoch)")
@click.option("--crontab", "cron", help='"minute hour day-of-month month day-of-week"')
@click.option("--solar", help="EVENT:LAT,LON, e.g. sunrise:40.7,-74.0 (needs ephem)")
@click.option("--args", "args_json", help="JSON list of positional arguments")
@click.option("--kwargs", "kwargs_json", help="JSON object of keyword arguments")
@click.option("--options", "options_json", help="JSON object of apply_async options")
@click.option("--queue", help="Queue (default: task_default_queue of the beat's app)")
@click.option("--priority", type=click.IntRange(0, 9))
@click.option("--expires", type=float, help="Seconds after each occurrence")
@click.option("--misfire", type=click.Choice(["coalesce", "run_all", "skip"]))
@click.option("--grace", type=float, help="Seconds late before an occurrence misfired")
@click.option("--disabled", is_flag=True, help="Store it disabled")
@click.pass_obj
def add_cmd(obj: Context, name: str, task: str, every: float | None, cron: str | None,
            solar: str | None, args_json: str | None, kwargs_json: str | None,
            options_json: str | None, queue: str | None, priority: int | None,
            expires: float | None, misfire: str | None, grace: float | None,
            disabled: bool) -> None:
    """Add or replace a DB-backed entry (running beats pick it up within one refresh)."""
    options = _json_arg(options_json, "options", dict)
    extra = {"queue": queue, "priority": priority, "expires": expires,
             "delayq_misfire": misfire, "delayq_grace": grace}
    options.update({k: v for k, v in extra.items() if v is not None})
    sched = _schedule(every, cron, solar)
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
            console.print(entries_table(queue, store))


register(beat_group)
if status_section not in STATUS_HOOKS:
    STATUS_HOOKS.append(status_section)
