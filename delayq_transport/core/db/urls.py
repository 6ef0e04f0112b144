"""Database URLs as users write them, turned into the one libpq URL delayq connects with.

Every entry point (the kombu transport, beat, the Dramatiq broker, the ``delayq`` command)
hands its URL to :class:`~.database.Database`, which calls :func:`normalize_url`, so each accepts
the same spellings of a primary and its standbys:

* libpq's multi-host form, ``postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write``,
  and its query form, ``postgresql://u@/db?host=h1,h2&port=5432,5432``: passed to libpq as
  they are; libpq tries the hosts on every new connection;
* kombu's failover list, ``delayq+postgresql://u@h1/db;delayq+postgresql://u@h2/db``: one
  string for every entry point, so beat or ``delayq status`` can be given Celery's
  ``broker_url`` as it is. Outside kombu it becomes the multi-host URL of its parts (they
  must name the same user, password and database), with ``target_session_attrs=read-write``
  unless a part says otherwise: the list names a primary and its standbys, and delayq writes.
* libpq's keyword/value connection string, ``dbname=app user=app host=db port=5432``, what
  Django and psycopg build (``conninfo``): the same keywords as query parameters of an
  otherwise empty URL (``postgresql://?dbname=app&user=app&host=db&port=5432``), which libpq
  reads exactly as the string, so every later step (session options, masking) has one form.

:func:`mask_password` renders any of them with the password hidden, for banners and errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .errors import InvalidInput

#: The schemes delayq accepts: libpq's, kombu's (``delayq+``, ``delayq://``) and SQLAlchemy's.
SCHEME_RE = re.compile(r"^(?:(?:delayq\+)?(?:postgres|postgresql)(?:\+psycopg2?)?|delayq)://")
#: Separates the URLs of kombu's failover list.
FAILOVER_SEPARATOR = ";"
PASSWORD_MASK = "***"
#: A keyword/value connection string starts with a keyword and ``=`` (libpq's grammar).
CONNINFO_RE = re.compile(r"^\s*[A-Za-z_]+\s*=")
#: The value of ``password`` in a keyword/value string: quoted (``\'`` escapes) or a word.
_CONNINFO_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def normalize_url(url: str) -> str:
    """Accept the URL spellings users paste (kombu's, SQLAlchemy's, a failover list) and
    return one libpq URL."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidInput(f"invalid database URL {url!r}: expected "
                           "postgresql://user@host:port/dbname (or delayq+postgresql://...)")
    if CONNINFO_RE.match(url):
        return conninfo_url(url)
    parts = [p.strip() for p in url.split(FAILOVER_SEPARATOR) if p.strip()]
    if len(parts) > 1:
        return merge_failover(parts)
    return _one(parts[0] if parts else url)


def conninfo_url(conninfo: str) -> str:
    """The libpq URL of a keyword/value string: each keyword a query parameter, so nothing is
    reinterpreted (a socket directory, several hosts, ``options`` with spaces); libpq's own
    parser checks it first, so a malformed string is refused with libpq's reason."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise InvalidInput(f"invalid connection string {mask_password(conninfo)!r}: "
                           f"{str(exc).strip()}") from None
    return params_url(params)


def params_url(params: Mapping[str, object]) -> str:
    """``postgresql://?key=value&...`` for libpq keywords (None values left out)."""
    query = "&".join(f"{quote(str(k), safe='')}={quote(str(v), safe='')}"
                     for k, v in params.items() if v is not None)
    return f"postgresql://?{query}" if query else "postgresql://"


def _one(url: str) -> str:
    if not SCHEME_RE.match(url):
        raise InvalidInput(
            f"invalid database URL {mask_password(url)!r}: expected "
            "postgresql://user@host:port/dbname (or delayq+postgresql://...)"
        )
    return SCHEME_RE.sub("postgresql://", url, count=1)


def merge_failover(urls: Sequence[str]) -> str:
    """One libpq multi-host URL for the URLs of a failover list.

    libpq tries its hosts in order on every connection, which is what the list means; it
    can do so only if every URL names the same user, password and database, and the query
    parameters agree (a URL without any takes the others').
    """
    split = [urlsplit(_one(u)) for u in urls]
    first = split[0]
    hosts: list[str] = []
    query: dict[str, str] = {}  # key -> raw "key=value", as written (libpq decodes it)
    for url, parts in zip(urls, split, strict=True):
        params = _raw_params(parts.query)
        if "host" in params or "hostaddr" in params or not parts.hostname:
            raise InvalidInput(
                f"the failover list {mask_password(FAILOVER_SEPARATOR.join(urls))!r} names a "
                f"host in a query parameter in {mask_password(url)!r}: write the hosts as "
                "one libpq URL instead (postgresql://user@h1:5432,h2:5432/db)")
        same = (parts.username, parts.password, parts.path) == \
            (first.username, first.password, first.path)
        clash = {k for k in params.keys() & query.keys() if params[k] != query[k]}
        if not same or clash:
            raise InvalidInput(
                f"the URLs of the failover list {mask_password(FAILOVER_SEPARATOR.join(urls))!r}"
                " must name the same user, password, database and parameters to be tried as one "
                "libpq multi-host URL" + (f" (they differ in {sorted(clash)})" if clash else ""))
        query.update(params)
        hosts.append(parts.netloc.rpartition("@")[2])
    userinfo = first.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{','.join(hosts)}" if userinfo else ",".join(hosts)
    merged = urlunsplit(first._replace(netloc=netloc, query="&".join(query.values())))
    return with_param(merged, "target_session_attrs", "read-write")


def _raw_params(query: str) -> dict[str, str]:
    """Query parameters by decoded name, each kept as written: re-encoding could change a
    value (``+`` is a plus sign to libpq, a space to ``parse_qsl``)."""
    return {unquote(p.split("=", 1)[0]): p for p in query.split("&") if p}


def with_param(url: str, key: str, value: str) -> str:
    """``url`` with the query parameter ``key=value`` added, unless it already has ``key``."""
    parts = urlsplit(url)
    if key in _raw_params(parts.query):
        return url
    pair = f"{quote(key)}={quote(value)}"
    return urlunsplit(parts._replace(query=f"{parts.query}&{pair}" if parts.query else pair))


def mask_password(url: str, mask: str = PASSWORD_MASK) -> str:
    """``url`` with every password hidden: each URL of a failover list, the user-info part
    (a multi-host netloc included), a ``password=`` query parameter, and the ``password`` of a
    keyword/value string."""
    if CONNINFO_RE.match(url):
        return _CONNINFO_PASSWORD.sub(lambda m: m.group(1) + mask, url)
    if FAILOVER_SEPARATOR in url:
        return FAILOVER_SEPARATOR.join(mask_password(p, mask)
                                       for p in url.split(FAILOVER_SEPARATOR))
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL we can take apart: show nothing of it that could be secret
        return "<unparsable URL>"
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = f"{userinfo.split(':', 1)[0]}:{mask}"
    query = parts.query
    if query and "password=" in query.lower():
        query = "&".join(
            f"{p.split('=', 1)[0]}={mask}" if p.lower().startswith("password=") else p
            for p in query.split("&"))
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{hosts}", query=query))
