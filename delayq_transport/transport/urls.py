"""Between kombu's ``Connection`` and the libpq URL the transport connects with.

kombu takes a ``delayq+postgresql://`` URL apart at the ``+`` and keeps the rest whole as the
``hostname``; ``delayq://...`` and every alternate of a failover list (``a;b``, re-parsed by
``Connection.switch``) it splits into host, port, user, password and database. Its own
rendering (``Connection.as_uri``, the worker's and beat's start-up banner, "Connected to ...")
parses the kept URL again with HTTP rules, and a libpq multi-host URL is not one:
``ValueError: Port could not be cast to integer value as '5451,h2:5452'`` ended ``celery
worker`` and ``celery beat`` at start (issue 26). :func:`render` is what the transport gives
kombu instead.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..core.db import FAILOVER_SEPARATOR, mask_password, with_param

DEFAULT_PORT = 5432


def url_from_client(client: Any) -> str:
    """The libpq URL of the connection kombu is making (see the module docstring).

    Parts come back unquoted, so they are quoted again. With a failover list every URL is
    asked for a read-write server: kombu's alternates cannot carry query parameters, and a
    standby that still answers would otherwise take the connection and refuse every write.
    """
    hostname = client.hostname or ""
    prefix = f"{client.uri_prefix}+" if client.uri_prefix else ""
    if prefix and hostname.startswith(prefix) and "://" not in hostname:
        hostname = hostname[len(prefix):]  # Connection.clone() after a switch re-adds it
    if "://" in hostname:
        url = hostname
    else:
        user = quote(client.userid or "postgres", safe="")
        password = f":{quote(client.password, safe='')}" if client.password else ""
        port = client.port or DEFAULT_PORT
        db = quote((client.virtual_host or "postgres").strip("/") or "postgres", safe="")
        url = f"postgresql://{user}{password}@{hostname or 'localhost'}:{port}/{db}"
    if len(client.alt or ()) > 1:
        url = with_param(url, "target_session_attrs", "read-write")
    return url


def configured_urls(client: Any) -> list[str]:
    """The broker URL(s) as configured: every URL of a failover list, or the one URL."""
    alternates = [u for u in (client.alt or ()) if isinstance(u, str)]
    if alternates:
        return alternates
    hostname = client.hostname or "localhost"
    if "://" in hostname:
        return [f"{client.uri_prefix}+{hostname}" if client.uri_prefix else hostname]
    scheme = client.transport_cls if isinstance(client.transport_cls, str) else "delayq"
    user = quote(client.userid, safe="") if client.userid else ""
    password = f":{quote(client.password, safe='')}" if client.password else ""
    userinfo = f"{user}{password}@" if user or password else ""
    port = f":{client.port}" if client.port else ""
    db = quote((client.virtual_host or "").strip("/"), safe="")
    return [f"{scheme}://{userinfo}{hostname}{port}/{db}"]


def render(client: Any, include_password: bool = False, mask: str = "**") -> str:
    """What ``Connection.as_uri`` shows: the configured URL(s), passwords masked, written as
    given (a multi-host URL keeps its hosts, a failover list its ``;``)."""
    urls = configured_urls(client)
    if not include_password:
        urls = [mask_password(u, mask) for u in urls]
    return FAILOVER_SEPARATOR.join(urls)
