"""A throwaway PgBouncer (Debian's ``pgbouncer``) in front of the test server.

Started as the ``postgres`` user when the tests run as root (PgBouncer refuses to run as
root), with its own config in a temporary directory: any database of the test server, any role
(``auth_query`` looks roles up, so least-privilege roles made by a test log in through it), and
the pool mode asked for. ``options`` may be refused (PgBouncer's default: the connection fails)
or ignored (``ignore_startup_parameters``: the settings are silently dropped); delayq must cope
with both.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from .clusters import free_port

CONFIG = """\
[databases]
* = host={host} port={port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
auth_user = {admin}
auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename = $1
pool_mode = {mode}
max_client_conn = 1000
default_pool_size = {pool_size}
max_db_connections = {pool_size}
server_reset_query = DISCARD ALL
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
{ignore}
"""


class PgBouncer:
    """``start()`` / ``stop()``; :meth:`url` turns a test-server URL into one through it."""

    def __init__(self, server_url: str, *, mode: str = "transaction",
                 ignore_options: bool = False, pool_size: int = 20) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer is not installed: apt-get install pgbouncer "
                               "(scripts/test does it)")
        self.binary = binary
        parts = urlsplit(server_url)
        self.server = parts
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"delayq-pgbouncer-{mode}-"))
        admin = parts.username or "postgres"
        (self.dir / "users.txt").write_text(f'"{admin}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(CONFIG.format(
            host=parts.hostname or "127.0.0.1", port=parts.port or 5432, listen=self.port,
            dir=self.dir, admin=admin, mode=mode, pool_size=pool_size,
            ignore="ignore_startup_parameters = extra_float_digits, options"
            if ignore_options else ""))
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            uid, gid = pwd.getpwnam("postgres")[2:4]
            for path in [self.dir, *self.dir.iterdir()]:
                os.chown(path, uid, gid)

    def _run(self, *args: str) -> None:
        cmd = [self.binary, *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)

    def start(self) -> PgBouncer:
        self._run("-d", str(self.dir / "pgbouncer.ini"))
        deadline = time.monotonic() + 15
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start: {self.log()[-2000:]}") from None
                time.sleep(0.1)

    def url(self, url_or_dbname: str) -> str:
        """The same database (and role) through PgBouncer."""
        if "://" not in url_or_dbname:
            return urlunsplit(self.server._replace(
                netloc=f"{self.server.username or 'postgres'}@127.0.0.1:{self.port}",
                path=f"/{url_or_dbname}"))
        parts = urlsplit(url_or_dbname)
        user = parts.netloc.rpartition("@")[0] or "postgres"
        return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{self.port}"))

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        pid_file = self.dir / "pgbouncer.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (ProcessLookupError, ValueError):
                pass
            deadline = time.monotonic() + 10
            while pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        shutil.rmtree(self.dir, ignore_errors=True)
