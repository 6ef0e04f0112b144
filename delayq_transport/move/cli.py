"""``delayq move-from <redis://… | amqp://…>``: the waiting Celery messages of a Redis or
RabbitMQ broker into delayq's table (see :mod:`.mover` for the order of operations)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import click
from rich.table import Table

from ..commands import Context, console, register
from ..core.db import mask_password
from .mover import DEFAULT_BATCH_SIZE, Mover, QueueMove
from .source import MoveRefused, Source

SCHEMES = {"redis": "redis", "rediss": "redis", "amqp": "amqp", "amqps": "amqp",
           "pyamqp": "amqp"}
#: Refused messages listed one by one; the rest are counted.
SHOWN_REFUSALS = 20


def open_source(url: str) -> Source:
    """The source for a broker URL; MoveRefused for any other scheme."""
    display = mask_password(url)
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    kind = SCHEMES.get(scheme)
    if kind == "redis":
        from .redis_source import RedisSource

        return RedisSource(url, display)
    if kind == "amqp":
        from .amqp_source import AmqpSource

        return AmqpSource(url.replace("pyamqp://", "amqp://", 1), display)
    known = ", ".join(f"{s}://" for s in SCHEMES)
    raise MoveRefused(f"cannot move from {display}: unknown scheme {scheme or '(none)'!r}; "
                      f"move-from reads {known} brokers")


def _steps(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    except ValueError:
        steps = ()
    if not steps or steps[0] != 0 or steps[-1] > 9:
        raise click.BadParameter(f"{text!r}: comma-separated buckets from 0 up to at most 9, "
                                 "as in the transport's priority_steps option")
    return steps


@click.command("move-from")
@click.argument("source_url", metavar="SOURCE_URL")
@click.option("--queue", "-Q", "queues", multiple=True,
              help="A queue to move (repeat for several). Default: Redis, every bound queue; "
                   "RabbitMQ, celery")
@click.option("--dry-run", is_flag=True, help="Check and print what would move; change nothing")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=DEFAULT_BATCH_SIZE,
              show_default=True, help="Messages taken from the source per transaction")
@click.option("--priority-steps", default="0,3,6,9", show_default=True,
              help="The delayq transport's priority_steps, if your workers set it")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON")
@click.pass_obj
def move_from_cmd(obj: Context, source_url: str, queues: tuple[str, ...], dry_run: bool,
                  batch_size: int, priority_steps: str, as_json: bool) -> None:
    """Move the waiting Celery messages of a Redis or RabbitMQ broker into delayq.

    Refuses while a worker (or anything else) consumes the source; gives back messages that
    killed Redis workers left unacknowledged; keeps task ids, ETAs, retries, headers and
    priorities; removes each message from the source once delayq holds it. Safe to run again
    after an interruption: nothing is lost or doubled. Exits 1 when a message was left in the
    source (not a Celery task, or its task id already in delayq with another message).
    """
    steps = _steps(priority_steps)
    source = open_source(source_url)
    stops: tuple[type[BaseException], ...] = (KeyboardInterrupt, *source.errors)
    try:
        with obj.queue() as queue:
            mover = Mover(source, queue, steps=steps, batch_size=batch_size,
                          progress=lambda line: None if as_json else console.print(
                              line, highlight=False))
            moves = mover.check(queues)
            if not as_json:
                _print_before(source.display, moves, dry_run)
            if dry_run:
                mover.preview(moves)
            else:
                mover.run(moves)
            leftovers = source.leftovers()
    except stops as exc:
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{source.display}: {exc}"
        raise MoveRefused(f"{what}. What was moved stays moved, nothing is lost: run the same "
                          "command again to finish") from exc
    finally:
        source.close()
    if as_json:
        click.echo(json.dumps(_as_json(moves, leftovers, dry_run), indent=2, default=str))
    elif dry_run:
        _print_plan(moves, source.can_preview)
    else:
        _print_after(moves)
    refused = [r for m in moves for r in m.refused] + leftovers
    if not as_json:
        _print_refused(refused, dry_run)
    if refused:
        raise SystemExit(1)


def _table(title: str, columns: Sequence[str], caption: str) -> Table:
    table = Table(title=title, caption=caption, caption_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    return table


def _print_before(display: str, moves: Sequence[QueueMove], dry_run: bool) -> None:
    console.print(f"{'dry run: ' if dry_run else ''}moving from {display}", highlight=False,
                  markup=False)
    table = _table("before", ("queue", "source", "unacked", "staged", "delayq"),
                   "source: waiting in the queue; unacked: taken by workers that are gone; "
                   "staged: taken by an interrupted move; delayq: rows of the queue's kinds "
                   "not in flight")
    for m in moves:
        table.add_row(m.queue, str(m.before.waiting), str(m.before.unacked),
                      str(m.before.staged), str(m.delayq_before))
    console.print(table)


def _print_after(moves: Sequence[QueueMove]) -> None:
    table = _table("after", ("queue", "moved", "already", "restored", "left", "source",
                             "delayq"),
                   "moved: into delayq by this run; already: offered by an interrupted run, "
                   "removed from the source now; restored: of them, from unacked; left: "
                   "refused, still in the source (listed below)")
    for m in moves:
        after = m.after.total if m.after else 0
        table.add_row(m.queue, str(m.moved), str(m.already), str(m.restored),
                      str(len(m.refused)), str(after), str(m.delayq_after))
    console.print(table)


def _when(at: datetime | None) -> str:
    return at.isoformat(timespec="seconds") if at else "-"


def _print_plan(moves: Sequence[QueueMove], listed: bool) -> None:
    if not listed:
        console.print("RabbitMQ shows no message without taking it: the counts above are what "
                      "would move.")
        return
    table = _table("would move", ("queue", "due", "ETA", "earliest ETA", "latest ETA",
                                  "refused"),
                   "due: no ETA, or one already passed (run at once)")
    for m in moves:
        table.add_row(m.queue, str(m.due), str(m.scheduled), _when(m.first_eta),
                      _when(m.last_eta), str(len(m.refused)))
    console.print(table)


def _print_refused(refused: Sequence[Any], dry_run: bool) -> None:
    if not refused:
        return
    verb = "would stay" if dry_run else "stayed"
    console.print(f"[yellow]{len(refused)} message(s) {verb} in the source:[/yellow]")
    for r in refused[:SHOWN_REFUSALS]:
        console.print(f"  {r.queue}: {r.what}: {r.reason}", highlight=False, markup=False)
    if len(refused) > SHOWN_REFUSALS:
        console.print(f"  ... and {len(refused) - SHOWN_REFUSALS} more")


def _as_json(moves: Sequence[QueueMove], leftovers: Sequence[Any], dry_run: bool
             ) -> dict[str, Any]:
    def counts(c: Any) -> Any:
        return None if c is None else {"waiting": c.waiting, "unacked": c.unacked,
                                       "staged": c.staged}

    return {
        "dry_run": dry_run,
        "queues": [{
            "queue": m.queue, "kinds": m.kinds, "before": counts(m.before),
            "after": counts(m.after), "delayq_before": m.delayq_before,
            "delayq_after": m.delayq_after, "moved": m.moved, "already": m.already,
            "restored": m.restored, "due": m.due, "scheduled": m.scheduled,
            "first_eta": m.first_eta, "last_eta": m.last_eta,
            "refused": [{"what": r.what, "reason": r.reason} for r in m.refused],
        } for m in moves],
        "leftovers": [{"what": r.what, "reason": r.reason} for r in leftovers],
    }


register(move_from_cmd)
