"""``delayq queues list|pause|resume|limit``: fleet-wide control of a queue
(docs/how-to/limits.md), through :class:`delayq_transport.browse.controls.QueueControls`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..browse.controls import QueueControls
from ..commands import Context, console, register
from ..core.queue import UNCHANGED, Control
from ..output import emit, json_option
from .status import controls_table

#: What ``--rate none`` and ``--concurrency none`` mean: remove that limit.
NONE = "none"


@contextmanager
def _controls(obj: Context) -> Iterator[QueueControls]:
    with obj.queue() as queue:
        yield QueueControls(queue)


def _said(control: Control, what: str) -> None:
    console.print(f"queue {control.name!r}: {what}", markup=False, highlight=False)


@click.group("queues")
def queues_group() -> None:
    """Pause, resume and limit queues for every worker of every host."""


@queues_group.command("list")
@json_option
@click.pass_obj
def list_cmd(obj: Context, as_json: bool) -> None:
    """Controlled queues: paused, limits, and how much of each is used now."""
    with _controls(obj) as controls:
        rows = [v.as_dict() for v in controls.list()]
    if as_json:
        emit({"controls": rows})
        return
    if rows:
        console.print(controls_table(rows))
    else:
        console.print("no queue is paused or limited", markup=False)


@queues_group.command("pause")
@click.argument("name")
@click.pass_obj
def pause_cmd(obj: Context, name: str) -> None:
    """Workers claim nothing of NAME (within a second); what waits stays as it is."""
    with _controls(obj) as controls:
        _said(controls.pause(name), "paused")


@queues_group.command("resume")
@click.argument("name")
@click.pass_obj
def resume_cmd(obj: Context, name: str) -> None:
    """Workers claim NAME's tasks again."""
    with _controls(obj) as controls:
        _said(controls.resume(name), "resumed")


def _limit_value(value: str | None, parse: Any) -> Any:
    if value is None:
        return UNCHANGED
    return None if value.strip().lower() == NONE else parse(value)


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a whole number (or 'none')") from None


@queues_group.command("limit")
@click.argument("name")
@click.option("--concurrency", help="Most tasks of NAME held at once by all workers ('none': "
                                    "no limit)")
@click.option("--rate", help="Most tasks of NAME started per interval by all workers: 50/s, "
                             "100/m, 1000/h ('none': no limit)")
@click.option("--key-concurrency", help="The same per limit key (delayq_limit_key)")
@click.option("--key-rate", help="The same per limit key (delayq_limit_key)")
@click.pass_obj
def limit_cmd(obj: Context, name: str, concurrency: str | None, rate: str | None,
              key_concurrency: str | None, key_rate: str | None) -> None:
    """Set NAME's fleet-wide limits; a limit not given stays as it is."""
    changes = {"concurrency": _limit_value(concurrency, _whole),
               "key_concurrency": _limit_value(key_concurrency, _whole),
               "rate": _limit_value(rate, str), "key_rate": _limit_value(key_rate, str)}
    with _controls(obj) as controls:
        control = controls.limit(name, **changes)
    parts = [f"{k.replace('_', ' ')} {v}" for k, v in (
        ("concurrency", control.concurrency), ("rate", rate if control.rate else None),
        ("key_concurrency", control.key_concurrency),
        ("key_rate", key_rate if control.key_rate else None)) if v is not None]
    _said(control, ", ".join(parts) if parts else "no limits")


register(queues_group)
