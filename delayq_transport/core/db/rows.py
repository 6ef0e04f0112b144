"""Rows of the statements whose results the core reads field by field, named in one place.

Each is a ``NamedTuple`` in the column order of its statement in queue.sql, so a row is
still a tuple (loaded by psycopg's C loaders, compared, unpacked) and a reordering of the
columns is fixed here, not at every ``r[4]`` that read it. :data:`ROW_TYPES` says which
statement makes which: :meth:`~.queries.Queries.direct` loads the poll's rows straight into
theirs (one tuple subclass per row, made by C: ``tuple.__new__``), and :func:`named` maps the
rows a cursor or a caller's connection returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple


class PolledRow(NamedTuple):
    """A row of ``try_poll_many``: an acquired message, or (``id`` None) the statement's last
    row, which carries only ``next_due`` and ``polled_at``."""

    id: int | None
    key: str
    kind: str
    payload: bytes
    #: The ``scheduledAt`` it had before this poll leased it (above the initial one: a
    #: redelivery).
    previous_at: int
    scheduled_at_initially: int
    created_at: int
    #: Position of its kind in the poll's ``kinds`` (the priority it was taken at).
    ord: int
    next_due: int | None
    polled_at: int | None


class CreatedRow(NamedTuple):
    """A row ``offer_batch_insert`` created."""

    key: str
    kind: str
    scheduled_at: int


#: The row type of each statement read by field (others stay plain tuples).
ROW_TYPES: dict[str, type[tuple[Any, ...]]] = {
    "try_poll_many": PolledRow,
    "offer_batch_insert": CreatedRow,
}


def row_maker(statement: str) -> Callable[[Any], tuple[Any, ...]]:
    """What turns one loaded row of ``statement`` into its row type (``tuple`` itself when it
    has none): the C constructor, no Python frame per row."""
    kind = ROW_TYPES.get(statement)
    return tuple if kind is None else partial(tuple.__new__, kind)


def named(statement: str, rows: Iterable[tuple[Any, ...]]) -> list[Any]:
    """``rows`` of ``statement`` as its row type."""
    make = row_maker(statement)
    return [make(r) for r in rows]
