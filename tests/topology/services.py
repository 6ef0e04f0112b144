"""Processes the topology tier starts (workers, beat, dramatiq, ``delayq``), and where their
Python path comes from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import psycopg.rows

HERE = Path(__file__).parent
TESTS = HERE.parent
ROOT = TESTS.parent


#: The table the topology apps' tasks write a row to per execution (tests/acceptance's shape).
RESULTS_DDL = """CREATE TABLE IF NOT EXISTS executions (
    id BIGSERIAL PRIMARY KEY, task_id TEXT, name TEXT, arg TEXT, pid INT,
    redelivered BOOLEAN, eta TEXT, ran_at TIMESTAMPTZ DEFAULT clock_timestamp())"""


def executions(results_url: str, name: str | None = None) -> list[dict[str, Any]]:
    with psycopg.connect(results_url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        where = " WHERE name = %s" if name else ""
        return cur.execute(f"SELECT * FROM executions{where} ORDER BY id",
                           (name,) if name else ()).fetchall()


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a started process: this checkout first on the path (the package may
    be installed from another one), then the apps of this tier and of tests/acceptance."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(HERE), str(TESTS / "acceptance"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def worker_args(name: str, *extra: str) -> list[str]:
    """``celery worker`` on the topology app (solo pool unless ``extra`` names another)."""
    pool = [] if any(a.startswith(("-P", "--pool")) for a in extra) else ["-P", "solo"]
    return ["celery", "-A", "topology_app", "worker", "--loglevel=INFO", *pool,
            "-n", f"{name}-{os.getpid()}@%h", *extra]


def beat_args() -> list[str]:
    return ["celery", "-A", "topology_app", "beat", "-S", "delayq_beat.Scheduler",
            "--loglevel=INFO"]


def python_module(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


class Service:
    """A started process (its own session, so a stop reaches its children) whose output goes
    to a log file the test searches."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path,
                 cwd: Path = HERE) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        """Bounded wait until ``text`` is in the output; fails at once if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if not self.alive():
                raise AssertionError(f"{self.args[2:4]} exited {self.proc.returncode} before "
                                     f"{text!r}:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the output of {self.args[2:4]} after "
                             f"{timeout:.0f}s:\n{self.log()[-3000:]}")

    def stop(self, timeout: float = 20.0) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._log.close()


