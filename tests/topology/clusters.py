"""Throw-away PostgreSQL clusters a test can kill: a primary, its streaming standby, a server
with a small ``max_connections``.

The machine's shared server (127.0.0.1:5432) serves every other test and engineer, so nothing
here touches it. Each cluster is ``initdb``-ed into a temporary directory owned by the
``postgres`` user (PostgreSQL refuses to run as root), listens on 127.0.0.1 on a port of its
own and on a Unix socket inside that directory, and is deleted by :meth:`Cluster.destroy`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg

PG_BIN = Path(os.environ.get("DELAYQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
#: The account clusters run as: PostgreSQL will not start as root.
PG_USER = os.environ.get("DELAYQ_PG_USER", "postgres")
#: Bounded waits on a cluster's own events (start, promotion, replication).
CLUSTER_WAIT_S = 60.0

#: Settings every throw-away cluster gets: small, quick to start, and no fsync, which changes
#: nothing the tests look at (the host never crashes: a killed postmaster loses what was still
#: in PostgreSQL's own memory, which is what a crash of the database server loses; what it had
#: written is in the host's page cache either way).
BASE_SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "'32MB'",
    "max_wal_size": "'256MB'",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] %a '",
    "wal_level": "replica",
    "max_wal_senders": "4",
    "hot_standby": "on",
}

T = TypeVar("T")


def available() -> str:
    """Why throw-away clusters cannot run here, or "" when they can."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL binaries in {PG_BIN} (set DELAYQ_PG_BIN)"
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"no {PG_USER!r} account to run throw-away clusters as"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != PG_USER:
        return f"tests run as neither root nor {PG_USER!r}: cannot start clusters as {PG_USER!r}"
    return ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def as_pg_user(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL binary as ``PG_USER`` (directly when the tests already run as it)."""
    if os.geteuid() == 0:
        args = ["runuser", "-u", PG_USER, "--", *args]
    kwargs.setdefault("timeout", CLUSTER_WAIT_S)
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done


def wait_for(predicate: Callable[[], T | None], what: str,
             timeout: float = CLUSTER_WAIT_S, interval: float = 0.05) -> T:
    """Bounded wait on an event of a cluster; the AssertionError names it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class Cluster:
    """One PostgreSQL cluster in ``root/name``: data directory, socket and log file."""

    def __init__(self, root: Path, name: str, port: int | None = None) -> None:
        self.root = root / name
        self.name = name
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        self.port = port or free_port()

    # -- creation ----------------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, name: str, settings: dict[str, str] | None = None,
               port: int | None = None) -> Cluster:
        """``initdb`` (trust authentication, no fsync) with ``settings`` in postgresql.conf."""
        cluster = cls(root, name, port)
        cluster._own_dir()
        as_pg_user([str(PG_BIN / "initdb"), "-D", str(cluster.data), "-U", "postgres",
                    "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"])
        cluster.configure({**BASE_SETTINGS, **(settings or {})})
        return cluster

    @classmethod
    def standby_of(cls, primary: Cluster, name: str,
                   settings: dict[str, str] | None = None) -> Cluster:
        """A streaming standby: ``pg_basebackup -R`` from the running ``primary`` (which writes
        ``primary_conninfo`` and ``standby.signal``); its ``application_name`` is ``name``, what
        ``synchronous_standby_names`` on the primary refers to."""
        standby = cls(primary.root.parent, name)
        standby._own_dir()
        as_pg_user([str(PG_BIN / "pg_basebackup"), "-D", str(standby.data), "-R",
                    "-X", "stream", "-c", "fast", "--no-sync",
                    "-d", f"host=127.0.0.1 port={primary.port} user=postgres "
                          f"application_name={name}"])
        if settings:
            standby.configure(settings)
        return standby

    def _own_dir(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(PG_USER)
            for path in (self.root.parent, self.root):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def configure(self, settings: dict[str, str]) -> None:
        """Append ``settings`` to postgresql.conf (the last line wins; a reload applies them)."""
        lines = "".join(f"{key} = {value}\n" for key, value in settings.items())
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(lines)

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start and wait until it accepts connections (a standby: until it is consistent)."""
        as_pg_user([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_path),
                    "-w", "-t", str(int(CLUSTER_WAIT_S)), "-o",
                    f"-p {self.port} -k {self.root}", "start"])

    def reload(self) -> None:
        as_pg_user([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "reload"])

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def kill(self) -> None:
        """``kill -9`` the postmaster, as a crash of the server does, and wait until nothing
        answers on its port (its backends exit once they see the postmaster gone)."""
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not self.accepts(), f"{self.name} to stop answering")

    def promote(self) -> None:
        """``pg_ctl promote`` and wait until the standby takes writes."""
        as_pg_user([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w",
                    "-t", str(int(CLUSTER_WAIT_S)), "promote"])

    def stop(self) -> None:
        if self.postmaster_pid() is None:
            return
        try:
            as_pg_user([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                        "-w", "stop"])
        except RuntimeError:  # killed already: the pid file is stale
            pass

    def destroy(self) -> None:
        """Stop it and delete its directory; any leftover backend is killed first."""
        self.stop()
        pid = self.postmaster_pid()
        if pid is not None:
            _kill_children_of(pid)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- connecting --------------------------------------------------------------------

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def accepts(self) -> bool:
        try:
            psycopg.connect(self.url(), connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            return False

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)

    def execute(self, statement: str, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        with self.connect(dbname) as conn:
            cur = conn.execute(statement)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def _kill_children_of(pid: int) -> None:
    """Backends orphaned by a killed postmaster exit by themselves; make sure of it."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def scratch_root(prefix: str = "delayq-topology-") -> Path:
    """A temporary directory for clusters; the caller removes it (``shutil.rmtree``)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextmanager
def replica_pair(root: Path, synchronous: bool,
                 settings: dict[str, str] | None = None) -> Iterator[tuple[Cluster, Cluster]]:
    """A running primary and its streaming standby (``pg_basebackup -R``), destroyed after.

    ``synchronous``: the primary's ``synchronous_standby_names`` names the standby, so a commit
    that waits for its WAL flush (``synchronous_commit=on``, delayq's ``durable_publish``)
    returns only once the standby has flushed it too.
    """
    primary = Cluster.create(root, "primary", settings)
    standby: Cluster | None = None
    try:
        primary.start()
        standby = Cluster.standby_of(primary, "standby")
        standby.start()
        if synchronous:
            primary.configure({"synchronous_standby_names": "'standby'"})
            primary.reload()
        wait_for(lambda: primary.execute(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
            " AND state = 'streaming'"), "the standby to stream")
        if synchronous:
            wait_for(lambda: primary.execute(
                "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"),
                "the standby to become synchronous")
        yield primary, standby
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()
