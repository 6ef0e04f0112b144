"""``delayq tasks dead-letters list|show|requeue|delete``: every front end's dead letters
(formats/deadletters.py), as the web page's dead-letters page shows them
(:class:`delayq_transport.browse.deadletters.DeadLetterService`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.table import Table

from ..browse import decode_cursor, encode_cursor
from ..browse.deadletters import DeadLetterService
from ..commands import Context, console
from ..output import emit, json_option


@contextmanager
def _service(obj: Context, hide_args: bool = False) -> Iterator[DeadLetterService]:
    with obj.queue() as queue:
        yield DeadLetterService(queue, hide_args=hide_args)


@click.group("dead-letters")
def dead_letters_group() -> None:
    """Messages no worker takes again, every front end's: list, show, requeue, delete."""


@dead_letters_group.command("list")
@click.option("--queue", "-Q", help="Queue name, or dramatiq:NAME / celery:NAME for one front "
              "end's (default: every queue)")
@click.option("--limit", "-n", type=click.IntRange(1, 500), default=50, show_default=True,
              help="Dead letters per page")
@click.option("--cursor", help="Continue after a previous page (printed at its end)")
@json_option
@click.pass_obj
def list_cmd(obj: Context, queue: str | None, limit: int, cursor: str | None,
             as_json: bool) -> None:
    """Newest first, one page at a time."""
    with _service(obj) as svc:
        page = svc.list_page(queue, decode_cursor(cursor), limit)
        queues = svc.queues()
    nxt = encode_cursor(*page.next_cursor) if page.next_cursor else None
    if as_json:
        emit({"queues": queues, "dead_letters": [d.as_dict() for d in page.items],
               "next_cursor": nxt})
        return
    table = Table("id", "failed at", "task", "queue", "retries", "exception")
    for d in (x.as_dict() for x in page.items):
        table.add_row(str(d["id"]), (d["failed_at"] or "")[:19], d["actor"] or "",
                      f"{d['front_end']}: {d['queue']}", str(d["retries"]),
                      d["exception"] or "")
    console.print(table)
    counts = ", ".join(f"{q['queue']}: {q['dead_letters']}{'+' if q['capped'] else ''}"
                       for q in queues)
    console.print(f"dead letters per queue: {counts or 'none'}", markup=False)
    if nxt:
        console.print(f"more: --cursor {nxt}", markup=False)


@dead_letters_group.command("show")
@click.argument("ident")
@click.option("--hide-args", is_flag=True, help="Do not show the message's arguments")
@json_option
@click.pass_obj
def show_cmd(obj: Context, ident: str, hide_args: bool, as_json: bool) -> None:
    """One dead letter by row id, with its traceback."""
    with _service(obj, hide_args) as svc:
        data = svc.find(ident).as_dict(full=True)
    if as_json:
        emit(data)
        return
    for key in ("id", "front_end", "queue", "actor", "message_id", "failed_at", "kept_until",
                "retries", "exception", "args", "kwargs"):
        console.print(f"{key:>11}: {data[key]}", markup=False, highlight=False)
    console.print(data["traceback"] or "(no traceback)", markup=False, highlight=False)


@dead_letters_group.command("requeue")
@click.argument("ident")
@json_option
@click.pass_obj
def requeue_cmd(obj: Context, ident: str, as_json: bool) -> None:
    """Back to its queue, due now, retries reset."""
    _change(obj, ident, as_json, "requeue")


@dead_letters_group.command("delete")
@click.argument("ident")
@json_option
@click.pass_obj
def delete_cmd(obj: Context, ident: str, as_json: bool) -> None:
    """Delete one dead letter for good."""
    _change(obj, ident, as_json, "delete")


def _change(obj: Context, ident: str, as_json: bool, action: str) -> None:
    """``requeue`` or ``delete`` of the service, reported as JSON or its one-line detail."""
    with _service(obj) as svc:
        result = getattr(svc, action)(ident)
    emit(result) if as_json else console.print(result["detail"], markup=False)
