"""``delayq tasks list|show|cancel|reschedule|run-now``: every waiting task is a row, so it can
be listed, searched, shown, cancelled and moved. All work goes through
:class:`delayq_transport.browse.TaskService`; ``--json`` prints what the web API returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.table import Table

from ..browse import (
    TaskFilter,
    TaskNotFound,
    TaskService,
    bulk,
    decode_cursor,
    encode_cursor,
    parse_duration,
    parse_when,
)
from ..browse.failures import FailureService
from ..browse.filters import STATES
from ..browse.occurrences import occurrence_entry
from ..browse.outcomes import finished_outcome
from ..commands import Context, console, register
from ..core.inspect import create_index, drop_index, index_ready
from ..output import emit, json_option
from .deadletters import dead_letters_group


@contextmanager
def _service(obj: Context, hide_args: bool = False) -> Iterator[TaskService]:
    with obj.queue() as queue:
        yield TaskService(queue, hide_args=hide_args)


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The list filters, shared by ``list`` and bulk ``cancel``."""
    options = [
        click.option("--queue", "-Q", help="Queue name: all its priority kinds, Celery's, "
                     "Dramatiq's and django.tasks' (dramatiq:NAME or django:NAME: one's "
                     "only), or a kind"),
        click.option("--task", "-t", help="Task name; * and ? match like a shell glob"),
        click.option("--state", type=click.Choice([*STATES, "failed"]),
                     help="Row state (retrying: waiting after a failed attempt); failed: "
                     "the tasks that failed for good, newest first"),
        click.option("--eta-after", help="ETA at or after this ISO time (naive = UTC)"),
        click.option("--eta-before", help="ETA before this ISO time"),
        click.option("--search", "-s", "text", help="Case-insensitive text in args/kwargs"),
        click.option("--beat-entry", help="Occurrences installed by this beat entry"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _filter(**kw: Any) -> TaskFilter:
    return TaskFilter.parse(kw["queue"], kw["task"], kw["state"], kw["eta_after"],
                            kw["eta_before"], kw["text"], kw["beat_entry"])


@click.group("tasks")
def tasks_group() -> None:
    """List, search, show, cancel and reschedule individual tasks."""


@tasks_group.command("list")
@filter_options
@click.option("--limit", "-n", type=click.IntRange(1, 500), default=50, show_default=True,
              help="Tasks per page")
@click.option("--cursor", help="Continue after a previous page (printed at its end)")
@click.option("--hide-args", is_flag=True, help="Do not show task arguments")
@click.option("--all-occurrences", is_flag=True,
              help="Every installed occurrence of periodic entries (default: each entry's "
              "next one; --beat-entry lists one entry's all)")
@json_option
@click.pass_obj
def list_cmd(obj: Context, limit: int, cursor: str | None, hide_args: bool,
             all_occurrences: bool, as_json: bool, **kw: Any) -> None:
    """Tasks sorted by ETA, one page at a time (keyset pagination: --cursor continues).

    A periodic entry (Celery beat's, Dramatiq's, django.tasks') shows as its next installed
    occurrence; --all-occurrences lists every one. ``--state failed`` lists failed tasks
    instead, newest first: django.tasks results FAILED and every front end's dead letters (a
    Celery task that failed and was acked is in its result backend: ``show``)."""
    if kw["state"] == "failed":
        _list_failed(obj, limit, cursor, as_json, all_occurrences=all_occurrences, **kw)
        return
    f = _filter(**kw)
    with _service(obj, hide_args) as svc:
        page = svc.list_page(f, decode_cursor(cursor), limit,
                             fold_occurrences=not all_occurrences)
    nxt = encode_cursor(*page.next_cursor) if page.next_cursor else None
    if as_json:
        emit({"tasks": [v.as_dict() for v in page.items], "next_cursor": nxt,
               "scanned": page.scanned, "partial": page.partial,
               "folded_entries": list(page.folded)})
        return
    table = Table(title=f"{obj.table}: {len(page.items)} task(s), sorted by ETA (UTC)")
    for col in ("id", "task id", "queue", "task", "eta", "state", "args"):
        table.add_column(col, overflow="fold")
    for v in page.items:
        d = v.as_dict()
        state = d["state"] + (" (redelivered)" if d["redelivered"] else "")
        entry = None if all_occurrences or f.beat_entry else occurrence_entry(d["key"])
        task = (d["task"] or "-") + (f" (periodic {entry}: next)" if entry else "")
        table.add_row(str(d["id"]), d["key"], d["queue"], task,
                      (d["eta"] or "")[:23].replace("T", " "), state, d["args_preview"])
    console.print(table)
    if page.folded:
        console.print(f"later occurrences of periodic entries folded ({', '.join(page.folded)})"
                      ": --all-occurrences lists them", soft_wrap=True, markup=False)
    if page.partial:
        console.print(f"scanned {page.scanned} rows without filling the page; more may match")
    if nxt:
        console.print(f"next page: --cursor {nxt}")


def _list_failed(obj: Context, limit: int, cursor: str | None, as_json: bool,
                 **kw: Any) -> None:
    """``list --state failed``: :class:`~..tasks.failures.FailureService`'s list."""
    unsupported = [f"--{k.replace('_', '-')}" for k in ("eta_after", "eta_before", "text",
                                                        "beat_entry", "all_occurrences")
                   if kw[k]]
    if unsupported:
        raise click.UsageError(f"--state failed takes --queue and --task, not "
                               f"{', '.join(unsupported).replace('--text', '--search')}")
    with obj.queue() as queue:
        page = FailureService(queue).failed_page(kw["queue"], kw["task"], cursor, limit)
    if as_json:
        emit({"failed": [f.as_dict() for f in page.items], "next_cursor": page.next_cursor})
        return
    table = Table(title=f"{obj.table}: {len(page.items)} failed task(s), newest first (UTC)")
    for col in ("id", "source", "queue", "task", "failed at", "attempts", "exception"):
        table.add_column(col, overflow="fold")
    for d in (f.as_dict() for f in page.items):
        table.add_row(d["ref"], d["source"], d["queue"] or "-", d["task"] or "-",
                      (d["failed_at"] or "")[:23].replace("T", " "), str(d["attempts"]),
                      d["exception"] or "-")
    console.print(table)
    console.print("retry or discard one: `delayq tasks retry|discard ID`; a Celery task's "
                  "failure is in its result backend: `delayq tasks show TASK_ID "
                  "--result-backend URL`", markup=False, highlight=False)
    if page.next_cursor:
        console.print(f"next page: --cursor {page.next_cursor}", markup=False)


@tasks_group.command("show")
@click.argument("ident")
@click.option("--hide-args", is_flag=True, help="Do not show task arguments")
@click.option("--result-backend", envvar="DELAYQ_RESULT_BACKEND", default=None, metavar="URL",
              help="The Celery app's result_backend: the outcome of a Celery task that left "
                   "the queue (read only; env: DELAYQ_RESULT_BACKEND)")
@json_option
@click.pass_obj
def show_cmd(obj: Context, ident: str, hide_args: bool, result_backend: str | None,
             as_json: bool) -> None:
    """One task by task id (or row id): the decoded message, row state and lease holder; once
    it left the queue, its outcome (a django.tasks result, or the Celery result backend's)."""
    with _service(obj, hide_args) as svc:
        try:
            data = svc.find(ident).as_dict(full=True)
        except TaskNotFound as exc:
            outcome = finished_outcome(svc.queue, ident, result_backend, hide_args)
            if outcome is None:
                hint = "" if result_backend else " (a Celery task's outcome: --result-backend)"
                raise TaskNotFound(f"{exc}{hint}") from None
            _show_outcome(outcome.as_dict(), as_json)
            return
    if as_json:
        emit(data)
        return
    message = data.pop("message") or {}
    table = Table(show_header=False, title=f"task {data['key']}")
    for name in ("id", "queue", "priority", "kind", "state", "redelivered", "eta",
                 "scheduled_at", "created_at", "lease"):
        table.add_row(name, str(data[name]))
    for name in ("format", "task", "args", "kwargs", "eta", "expires", "retries"):
        table.add_row(f"message.{name}", json.dumps(message.get(name), default=str))
    table.add_row("message.headers", json.dumps(message.get("headers"), default=str))
    console.print(table)


def _show_outcome(data: dict[str, Any], as_json: bool) -> None:
    """A task that left the queue: its outcome, as ``show --json`` and the page have it."""
    if as_json:
        emit(data)
        return
    table = Table(show_header=False, title=f"task {data['task_id']} (not waiting: its "
                                           f"outcome, from {data['source']})")
    for name in ("state", "task", "date_done", "retries", "result", "error"):
        if data.get(name) is not None:
            table.add_row(name, json.dumps(data[name], default=str) if name == "result"
                          else str(data[name]))
    console.print(table)
    if data.get("traceback"):
        console.print(data["traceback"], markup=False, highlight=False)


def _done(as_json: bool, data: dict[str, Any], text: str) -> None:
    emit(data) if as_json else console.print(text)


@tasks_group.command("cancel")
@click.argument("ident", required=False)
@filter_options
@click.option("--yes", "-y", is_flag=True, help="Do not ask before a bulk cancel")
@json_option
@click.pass_obj
def cancel_cmd(obj: Context, ident: str | None, yes: bool, as_json: bool, **kw: Any) -> None:
    """Cancel one task (ID), or every waiting match of the filters (asks first).

    A task a worker holds (in flight) is never cancelled: revoke it through Celery instead.
    """
    f = _filter(**kw)
    given = any(v for v in kw.values())
    with _service(obj) as svc:
        if ident:
            if given:
                raise click.UsageError("give a task id or filters, not both")
            result = svc.cancel(ident)
            _done(as_json, vars(result), result.detail)
            return
        if not given:
            raise click.UsageError("give a task id, or filters selecting what to cancel")
        ids = bulk.target_ids(svc, f)
        if not ids:
            _done(as_json, {"matched": 0, "cancelled": 0}, "no task matches")
            return
        if not yes and not click.confirm(f"cancel {len(ids)} matching task(s)? (in flight "
                                         "ones are left alone)"):
            raise click.Abort()
        outcome = bulk.apply(svc, "cancel", ids)
    _done(as_json, {**outcome.as_dict(), "cancelled": outcome.done}, outcome.detail)


@tasks_group.command("reschedule")
@click.argument("ident")
@click.option("--at", "at", help="New ETA, ISO-8601 (naive = UTC)")
@click.option("--in", "delay", help="New ETA from now: 90s, 15m, 2h, 1d")
@json_option
@click.pass_obj
def reschedule_cmd(obj: Context, ident: str, at: str | None, delay: str | None,
                   as_json: bool) -> None:
    """Move a waiting task to another time (its message's ETA moves with it)."""
    if (at is None) == (delay is None):
        raise click.UsageError("give exactly one of --at or --in")
    with _service(obj) as svc:
        result = (svc.reschedule(ident, parse_when(at, "--at")) if at is not None
                  else svc.reschedule_in(ident, parse_duration(str(delay), "--in")))
    _done(as_json, vars(result), result.detail)


@tasks_group.command("run-now")
@click.argument("ident")
@json_option
@click.pass_obj
def run_now_cmd(obj: Context, ident: str, as_json: bool) -> None:
    """Make a waiting task due now: the next free worker runs it."""
    with _service(obj) as svc:
        result = svc.run_now(ident)
    _done(as_json, vars(result), result.detail)


@tasks_group.command("retry")
@click.argument("ident")
@json_option
@click.pass_obj
def retry_cmd(obj: Context, ident: str, as_json: bool) -> None:
    """Run a failed or retrying task again now: a django.tasks result id (one more attempt),
    a dead letter's id (requeued, retries reset), or a waiting task's id (made due now)."""
    with obj.queue() as queue:
        done = FailureService(queue).retry(ident)
    _done(as_json, done.as_dict(), done.detail)


@tasks_group.command("discard")
@click.argument("ident")
@json_option
@click.pass_obj
def discard_cmd(obj: Context, ident: str, as_json: bool) -> None:
    """Forget a failed or retrying task: a django.tasks result id (result deleted), a dead
    letter's id (deleted), or a waiting task's id (cancelled; a django.tasks task's unfinished
    result deleted too)."""
    with obj.queue() as queue:
        done = FailureService(queue).discard(ident)
    _done(as_json, done.as_dict(), done.detail)


@tasks_group.command("search-index")
@click.argument("action", type=click.Choice(["create", "drop", "status"]))
@json_option
@click.pass_obj
def search_index_cmd(obj: Context, action: str, as_json: bool) -> None:
    """Opt-in trigram index that makes argument search answer at once on big tables.

    Publishing pays for its entries (see docs/benchmarks.md); without it a search scans in slices.
    ``create`` builds it CONCURRENTLY (publishing goes on) and needs the pg_trgm extension.
    """
    with obj.queue() as queue:
        if action == "create":
            create_index(queue)
        elif action == "drop":
            drop_index(queue)
        ready = index_ready(queue)
    _done(as_json, {"table": obj.table, "search_index": ready},
          f"search index on {obj.table}: {'present' if ready else 'absent'}")


register(tasks_group)
tasks_group.add_command(dead_letters_group)
