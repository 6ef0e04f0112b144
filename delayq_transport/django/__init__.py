"""Django: delayq's broker URL from ``DATABASES``, and publishes that join ``atomic()``.

* :func:`broker_url` / :func:`database_url`: the URL of a ``DATABASES`` entry (an alias, read
  from the settings once they are loaded, or the entry's dict itself, inside ``settings.py``),
  as Celery's ``broker_url`` (``delayq+postgresql://...``) or as the plain libpq URL the other
  entry points take (the Dramatiq broker, beat's ``delayq_beat_database_url``, ``delayq -d``).
  The keys map as Django's PostgreSQL backend maps them to libpq (``NAME``, ``USER``,
  ``PASSWORD``, ``HOST``, ``PORT`` and every libpq keyword of ``OPTIONS``).
* ``INSTALLED_APPS += ["delayq_transport.django"]`` with ``DELAYQ_JOIN_ATOMIC = True``: every
  task published inside ``transaction.atomic()`` on ``DELAYQ_DATABASE`` (default
  ``"default"``) is written in that transaction (see :mod:`.apps`); outside one, publishing is
  unchanged.

See docs/how-to/django.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured

from ..core import InvalidInput
from ..core.db import params_url


class FrameworkMissing(ImproperlyConfigured):
    """Django's task framework is not importable: neither ``django.tasks`` (Django >= 6) nor
    the ``django-tasks`` backport (``django_tasks``). Raised on import of the backend's modules
    (:mod:`._framework`), and by ``delayq_transport.django.tasks``' names when used: that module
    stays importable for Celery's Django fixup."""


#: ``OPTIONS`` keys that Django or the driver consume, not libpq: left out of the URL.
DJANGO_ONLY_OPTIONS = frozenset({
    "assume_role", "isolation_level", "pool", "server_side_binding", "cursor_factory",
    "context", "prepare_threshold",
})


def broker_url(database: str | Mapping[str, Any] = "default") -> str:
    """Celery's ``broker_url`` for a ``DATABASES`` entry: ``delayq+`` and :func:`database_url`."""
    return "delayq+" + database_url(database)


def database_url(database: str | Mapping[str, Any] = "default") -> str:
    """The libpq URL of a ``DATABASES`` entry (an alias, or the entry itself)."""
    entry = _entry(database)
    engine = str(entry.get("ENGINE", ""))
    if "postgresql" not in engine and "postgis" not in engine:
        raise InvalidInput(f"DATABASES entry {_name(database)} uses {engine or 'no ENGINE'}: "
                           "delayq needs PostgreSQL (django.db.backends.postgresql)")
    options = dict(entry.get("OPTIONS") or {})
    params: dict[str, Any] = {}
    name = entry.get("NAME")
    if name:
        params["dbname"] = name
    elif name is None:  # Django then connects to the 'postgres' database
        params["dbname"] = "postgres"
        options.pop("service", None)
    for key, word in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host"),
                      ("PORT", "port")):
        if entry.get(key):
            params[word] = entry[key]
    params.update({k: v for k, v in options.items() if k not in DJANGO_ONLY_OPTIONS})
    return _url(params)


def _entry(database: str | Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(database, str):
        return database
    from django.conf import settings  # only once settings are loaded: an alias needs them

    databases = getattr(settings, "DATABASES", {})
    if database not in databases:
        raise InvalidInput(f"no DATABASES entry {database!r} (have: "
                           f"{', '.join(sorted(databases)) or 'none'})")
    return databases[database]


def _name(database: str | Mapping[str, Any]) -> str:
    return repr(database) if isinstance(database, str) else repr(database.get("NAME"))


def _url(params: dict[str, Any]) -> str:
    """``postgresql://user:password@host:port/dbname?rest`` when the host is one plain name
    (what banners show best); libpq's query form otherwise (a socket directory, several
    hosts), which libpq reads the same."""
    host = str(params.get("host") or "")
    if not host or host.startswith("/") or "," in host or "dbname" not in params:
        return params_url(params)
    rest = dict(params)
    user, password = rest.pop("user", None), rest.pop("password", None)
    userinfo = quote(str(user), safe="") if user else ""
    if password:
        userinfo += ":" + quote(str(password), safe="")
    netloc = (f"{userinfo}@" if userinfo else "") + (f"[{host}]" if ":" in host else host)
    rest.pop("host")
    if rest.get("port"):
        netloc += f":{rest.pop('port')}"
    path = quote(str(rest.pop("dbname")), safe="")
    query = params_url(rest).removeprefix("postgresql://")
    return f"postgresql://{netloc}/{path}{query}"
