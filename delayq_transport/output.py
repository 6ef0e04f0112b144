"""What the CLI prints, on a terminal and in a log.

On a terminal, rich fits tables to the window. Anywhere else (CI, a deploy log, ``> file``,
a pipe) the reader greps: a task id folded over three lines, or a note cut to "disabled in
django-celer…", cannot be found. So when stdout is not a terminal, :class:`CliConsole` has no
width limit (rich would otherwise assume 80 columns, or the width of the terminal the command
was started from) and prints every table one line per row: no cell is wrapped, folded or cut,
and a cell of several lines is joined with ``"; "``. The box drawing stays, so the output
reads as on a terminal, one row per line.

Every listing command also takes ``--json`` (:func:`json_option`, :func:`emit`) for what a
program reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import click
from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

#: Width of output that is not a terminal: no row of any listing comes near it, and rich never
#: pads a line to it (tables take the width of their content).
LOG_WIDTH = 1_000_000

#: Joins the lines of a multi-line cell when the output is not a terminal.
LINE_JOIN = "; "


class CliConsole(Console):
    """A console that, when it does not write to a terminal, has no width limit and prints
    every rich table one line per row (:func:`log_layout`). Tables are laid out here, where
    they are printed, so a command (an adapter's too) builds a plain ``rich.table.Table``."""

    @property
    def on_terminal(self) -> bool:
        """Whether the output goes to a terminal, asked of the file itself: rich's
        ``is_terminal`` is also true under ``FORCE_COLOR``, which CI systems set for colours
        in a log that is still read by grep."""
        try:
            return bool(self.file.isatty())
        except (AttributeError, ValueError):  # no isatty, or closed (the end of a test run)
            return False

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.on_terminal else ConsoleDimensions(LOG_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def render(self, renderable: RenderableType,
               options: ConsoleOptions | None = None) -> Iterable[Segment]:
        if isinstance(renderable, Table) and not self.on_terminal:
            log_layout(renderable)
        return super().render(renderable, options)


def _one_line(cell: Any) -> Any:
    """A cell's lines joined with :data:`LINE_JOIN` (a ``str`` may hold markup: kept)."""
    if isinstance(cell, Text):
        if "\n" not in cell.plain:
            return cell
        return Text(LINE_JOIN).join(line for line in cell.split("\n") if line.plain.strip())
    if isinstance(cell, str) and "\n" in cell:
        return LINE_JOIN.join(line.strip() for line in cell.splitlines() if line.strip())
    return cell


def _unwrapped(text: Any) -> Any:
    """A title or caption on one line: rich wraps them to the table's width otherwise."""
    if isinstance(text, str):
        text = Text.from_markup(text)
    if isinstance(text, Text):
        text = _one_line(text)
        text.no_wrap, text.overflow = True, "ignore"
    return text


def log_layout(table: Table) -> None:
    """Lay ``table`` out for a log: no cell wrapped, folded or cut, one line per row (a cell,
    title or caption of several lines joined with :data:`LINE_JOIN`)."""
    table.title, table.caption = _unwrapped(table.title), _unwrapped(table.caption)
    for column in table.columns:
        column.no_wrap = True
        column.overflow = "ignore"
        column._cells = [_one_line(cell) for cell in column._cells]


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``, passed as ``as_json``: what every listing command takes."""
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output")(fn)


def emit(data: Any) -> None:
    """``--json`` output: indented, instants as ISO-8601 strings, on stdout alone."""
    click.echo(json.dumps(data, indent=2, default=str))
