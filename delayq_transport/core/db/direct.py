"""Hot statements run on libpq itself, past psycopg's cursor: the publish and the poll.

Every publish runs ``offer_insert`` once, every poll ``try_poll_many``. Through a reused psycopg
cursor a statement pays for query conversion, adaptation (arrays are costly), a
generator-driven wait and result loading; prepared once per connection and run with libpq's
``PQexecPrepared`` (psycopg's ``PGconn.exec_prepared``, which releases the GIL while it waits)
it pays for little more than the round trip. Client CPU of a whole call, this revision against
the one before (``bench/diagnostics/profile_direct.py`` run with each on ``PYTHONPATH``,
alternately):
``offer(durable=False)`` 66 -> 43 us, a poll of 5 rows 192 -> 131 us (issue 11); the server's
share is unchanged (``bench/diagnostics/profile_publish.py``).

The boundary stays narrow: the statement text still comes from queue.sql, its ``%(name)s``
placeholders become ``$n`` here, values are still bound parameters (text format, bytea in
binary), and errors become psycopg's own exceptions, so :func:`~.database.translate` and the retry
loop of :meth:`~.database.Database.run` treat them exactly as before. Values are ``str``, ``int``,
``bool``, ``bytes`` (binary), ``None`` or lists of ``str``/``int``/``None`` (array literals);
results come back in text format and are loaded by psycopg's own loaders (``rows``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from psycopg import abc
from psycopg import errors as pg_errors
from psycopg.adapt import Transformer
from psycopg.pq import ConnStatus, DiagnosticField, ExecStatus

_PLACEHOLDER = re.compile(r"%\((\w+)\)([sb])")
#: SQLSTATE of "prepared statement does not exist" (a ``DISCARD ALL`` by someone else).
_NO_SUCH_STATEMENT = b"26000"
_OK = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)


class DirectStatement:
    """A named statement prepared once per connection and executed by libpq: ``first`` for
    the publish (its row's ``scheduledAt``, as text), ``rows`` for the poll, each row made by
    ``make_row`` (core/db/rows.py: the statement's named row type)."""

    def __init__(self, name: str, query: str,
                 make_row: Callable[[Any], tuple[Any, ...]] = tuple) -> None:
        names: list[str] = []
        binary: dict[str, bool] = {}

        def positional(match: re.Match[str]) -> str:
            name, fmt = match.group(1), match.group(2)
            if name not in binary:
                names.append(name)
                binary[name] = fmt == "b"
            elif binary[name] != (fmt == "b"):
                raise ValueError(f"{name} is bound both as text and as binary in {query!r}")
            return f"${names.index(name) + 1}"

        text = _PLACEHOLDER.sub(positional, query)
        if "%" in text.replace("%%", ""):
            raise ValueError(f"statement {name!r} has a placeholder other than %(name)s/b")
        self.sql = text.replace("%%", "%").encode()
        # Named after the text too: queues of two tables may share a connection.
        self.name = f"delayq_{name}_{hashlib.sha1(self.sql).hexdigest()[:12]}".encode()
        self.names = tuple(names)
        self.formats = [1 if binary[n] else 0 for n in names]
        self.make_row = make_row

    def run(self, conn: psycopg.Connection[Any], params: Mapping[str, Any]) -> Any:
        """Execute on ``conn`` (idle, autocommit) and return libpq's result (text format);
        raise psycopg's exception on failure."""
        state: _ConnState | None = getattr(conn, "_delayq_direct", None)
        if state is None:
            state = conn._delayq_direct = _ConnState(conn)  # type: ignore[attr-defined]
        encoding = state.encoding
        # None is SQL NULL to libpq; psycopg's type hint leaves it out.
        values: list[Any] = [_encode(params[n], encoding) for n in self.names]
        if state.unnamed:  # behind a transaction pooler: parse, bind and run in one message
            result = conn.pgconn.exec_params(self.sql, values, None, self.formats)
            _check(conn, result)
            return result
        if self.name not in state.prepared:
            self._prepare(conn)
            state.prepared.add(self.name)
        result = conn.pgconn.exec_prepared(self.name, values, self.formats)
        if (result.status not in _OK
                and result.error_field(DiagnosticField.SQLSTATE) == _NO_SUCH_STATEMENT):
            self._prepare(conn)  # discarded behind our back: prepare again, once
            result = conn.pgconn.exec_prepared(self.name, values, self.formats)
        _check(conn, result)
        return result

    def first(self, conn: psycopg.Connection[Any], params: Mapping[str, Any]) -> bytes | None:
        """The first column of the first row, as text (None: no row, or NULL)."""
        result = self.run(conn, params)
        return result.get_value(0, 0) if result.ntuples else None

    def rows(self, conn: psycopg.Connection[Any],
             params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Every row, loaded by psycopg's own (C) loaders from the columns' types."""
        result = self.run(conn, params)
        loader: abc.Transformer = conn._delayq_direct.loader  # type: ignore[attr-defined]
        loader.set_pgresult(result)
        return loader.load_rows(0, result.ntuples, self.make_row)

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        _check(conn, conn.pgconn.prepare(self.name, self.sql, None))


class _ConnState:
    """What a connection has prepared, its client encoding (read once: it is a lookup), the
    loader of its results, and whether it may prepare at all: a connection behind a
    transaction pooler (the pool's configure step marked it ``_delayq_unprepared``, see
    :class:`~.database.Database`) lends a different server session to every transaction, where a
    named statement exists already or not at all."""

    __slots__ = ("encoding", "loader", "prepared", "unnamed")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.encoding = conn.info.encoding
        self.loader: abc.Transformer = Transformer(conn)
        self.prepared: set[bytes] = set()
        self.unnamed = getattr(conn, "_delayq_unprepared", False)


def _encode(value: Any, encoding: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode(encoding)
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, list):  # an array literal: {"a","b\"c"}, {1,NULL}
        return b"{%s}" % b",".join(_element(v, encoding) for v in value)
    raise TypeError("direct statements bind str, int, bool, bytes, None or lists of str/int, "
                    f"not {type(value).__name__}")


def _element(value: Any, encoding: str) -> bytes:
    if value is None:
        return b"NULL"
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    if isinstance(value, str):
        quoted = value.replace("\\", "\\\\").replace('"', '\\"')
        return b'"%s"' % quoted.encode(encoding)
    raise TypeError(f"array elements must be str, int or None, not {type(value).__name__}")


def _check(conn: psycopg.Connection[Any], result: Any) -> None:
    if result.status in _OK:
        return
    if conn.pgconn.status == ConnStatus.BAD:
        message = conn.pgconn.error_message.decode(errors="replace").strip()
        raise psycopg.OperationalError(f"connection lost: {message}")
    raise pg_errors.error_from_result(result, encoding=conn.info.encoding)
