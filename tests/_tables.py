"""Read the tables rich prints (``delayq status``, ``delayq beat list``) back into cells, so a
test asserts on the row and column it is about rather than on any digit of the output."""

from __future__ import annotations


def rich_tables(out: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every box-drawn table of ``out``: (column titles, body lines split into cells).

    Titles spanning several lines are joined with a space; a row spanning several lines (a
    wrapped cell) stays several lines, whose first cell is blank after the first."""
    tables: list[tuple[list[str], list[list[str]]]] = []
    header: list[list[str]] = []
    body: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("┏"):
            header, body = [], []
        elif line.startswith("┃"):
            header.append([c.strip() for c in line.strip().strip("┃").split("┃")])
        elif line.startswith("│"):
            body.append([c.strip() for c in line.strip().strip("│").split("│")])
        elif line.startswith("└"):
            titles = [" ".join(p for p in parts if p) for parts in zip(*header, strict=True)]
            tables.append((titles, body))
    return tables


def row_cells(out: str, first_cell: str, table: int = 0) -> dict[str, list[str]]:
    """The row of table number ``table`` whose first cell is ``first_cell``, by column title;
    each cell as its non-blank lines."""
    titles, body = rich_tables(out)[table]
    start = next((i for i, r in enumerate(body) if r[0] == first_cell), None)
    assert start is not None, f"no row {first_cell!r} in table {table} of:\n{out}"
    end = next((i for i in range(start + 1, len(body)) if body[i][0]), len(body))
    return {t: [r[j] for r in body[start:end] if r[j]] for j, t in enumerate(titles)}
