"""What one install of delayq must do, run by the python of a fresh venv that holds it.

    <venv>/bin/python scripts/packaging_smoke.py EXTRAS DATABASE_URL

``scripts/check-packaging`` installs the built wheel with one set of extras into a fresh venv
(no system site-packages) and runs this: ``delayq --help`` and every command's ``--help``, then
what that set serves, against a fresh database of its own. Only the standard library and the
installed package are used, so a dependency the wheel does not declare fails here, as it would
for a user. EXTRAS: a key of :data:`CHECKS` (the sets of scripts/check-packaging).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BIN = Path(sys.executable).parent
COMMANDS = ("beat", "demo", "grants", "metrics", "migrate", "move-from", "spark-report", "status",
            "tasks", "uninstall", "web")


def delayq(*args: str, expect: int = 0, env: dict[str, str] | None = None,
           timeout: float = 180) -> str:
    """Run the venv's ``delayq``; fail with its output unless it exits with ``expect``."""
    proc = subprocess.run([str(BIN / "delayq"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    output = proc.stdout + proc.stderr
    if proc.returncode != expect:
        raise SystemExit(f"`delayq {' '.join(args)}` exited {proc.returncode} "
                         f"(expected {expect}):\n{output[-4000:]}")
    print(f"ok: delayq {' '.join(args)}", flush=True)
    return " ".join(output.split())


def expect(text: str, output: str) -> None:
    if text not in output:
        raise SystemExit(f"expected {text!r} in:\n{output[-4000:]}")


def check_help() -> None:
    """``delayq --help`` (the installed entry point, which imports every command's module),
    then each command's ``--help`` in this process (one start-up instead of ten)."""
    from click.testing import CliRunner

    from delayq_transport.cli import main

    listed = delayq("--help")
    missing = [c for c in COMMANDS if f" {c} " not in f" {listed} "]
    if missing:
        raise SystemExit(f"`delayq --help` does not list {missing}: {listed}")
    for command in COMMANDS:
        result = CliRunner().invoke(main, [command, "--help"])
        if result.exit_code != 0:
            raise SystemExit(f"`delayq {command} --help` failed:\n{result.output}\n"
                             f"{result.exception!r}")
    print(f"ok: delayq COMMAND --help for {', '.join(COMMANDS)}", flush=True)


def check_base(url: str) -> None:
    """The core install: schema, status, grants, metrics, tasks, beat, a Celery round trip
    (the demo's worker), uninstall's listing; the extras' commands say what to install."""
    expect("applied migrations", delayq("-d", url, "migrate"))
    json.loads(delayq("-d", url, "status", "--json"))
    delayq("-d", url, "status")
    expect("GRANT", delayq("-d", url, "grants", "--role", "app", "--as", "producer"))
    expect("delayq_up", delayq("-d", url, "metrics"))
    delayq("-d", url, "tasks", "list")
    delayq("-d", url, "beat", "list")
    expect("6/6 tasks done", delayq("-d", url, "demo", "--no-web", "--linger", "0"))
    expect("dry run", delayq("-d", url, "uninstall"))
    expect("delayq[web]", delayq("-d", url, "web", expect=1))
    expect("delayq[spark]", delayq("-d", url, "spark-report", expect=1))
    expect("delayq[move]", delayq("-d", url, "move-from", "redis://127.0.0.1:6379/15",
                                  "--dry-run", expect=1))
    expect("delayq[embedded]", delayq("demo", env=_without_database_url(), expect=1))


def check_web(url: str) -> None:
    """``delayq web`` serves its page and JSON API."""
    delayq("-d", url, "migrate")
    port = _free_port()
    server = subprocess.Popen([str(BIN / "delayq"), "-d", url, "web", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        page = _get(f"http://127.0.0.1:{port}/", server)
        overview = json.loads(_get(f"http://127.0.0.1:{port}/api/overview", server))
        assert "delayq" in page and isinstance(overview, dict), (page[:200], overview)
        print(f"ok: delayq web answered / and /api/overview on port {port}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)


def check_dramatiq(url: str) -> None:
    """The Dramatiq broker: a delayed send waits as a row, then is consumed and acked."""
    import dramatiq

    from delayq_transport.dramatiq import DelayqBroker

    broker = DelayqBroker(url=url, polling_interval=0.2)
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="smoke")
    def hello(name: str) -> None:
        print(f"hello {name}")

    message = hello.send_with_options(args=("later",), delay=500)
    assert broker.queue.count_waiting(broker.kinds_for("smoke")) == 1, "no waiting row"
    consumer = broker.consume("smoke", timeout=200)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = next(consumer)
        if got is not None:
            assert got.message_id == message.message_id
            consumer.ack(got)
            break
    else:
        raise SystemExit("the delayed Dramatiq message never arrived")
    consumer.close()
    broker.close()
    print("ok: Dramatiq send with delay, consume, ack", flush=True)


def check_spark(url: str) -> None:
    """pyspark, pyarrow and pandas as the extra installs them: a local Spark reads the table."""
    import delayq_transport.spark as spark

    assert callable(spark.schedule_tasks)
    delayq("-d", url, "migrate")
    report = delayq("-d", url, "spark-report", "--master", "local[1]", "--partitions", "1",
                    timeout=300)
    expect("Backlog of delayed_queue", report)


def check_combined(url: str) -> None:
    """The extras docs/getting-started.md installs together: each still does its part."""
    check_web(url)
    check_dramatiq(url)


def check_embedded(url: str) -> None:
    """``delayq demo`` with no database starts the embedded PostgreSQL (in a fresh data
    directory) and serves the page during the demo."""
    data = Path(os.environ["DELAYQ_SMOKE_TMP"]) / "xdg-data"
    env = dict(_without_database_url(), XDG_DATA_HOME=str(data))
    output = delayq("demo", "--web-port", "0", "--linger", "0", env=env, timeout=300)
    for text in ("started embedded PostgreSQL", "6/6 tasks done", "web page: http://127.0.0.1:"):
        expect(text, output)


CHECKS: dict[str, Callable[[str], None]] = {
    "base": check_base, "web": check_web, "dramatiq": check_dramatiq, "spark": check_spark,
    "combined": check_combined, "embedded": check_embedded,
}


def _without_database_url() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DELAYQ_DATABASE_URL"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, server: subprocess.Popen[str], timeout: float = 30) -> str:
    """GET ``url`` once the server answers (bounded wait; its output if it died)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            if server.poll() is not None:
                out = server.stdout.read() if server.stdout else ""
                raise SystemExit(f"delayq web exited:\n{out}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _database(base: str) -> tuple[str, Callable[[], None]]:
    """A fresh database on the server of ``base``, and how to drop it."""
    import psycopg

    name = f"delayq_pkg_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return urlunsplit(urlsplit(base)._replace(path=f"/{name}")), drop


def main() -> None:
    extras, base = sys.argv[1], sys.argv[2]
    check_help()
    url, drop = _database(base)
    try:
        CHECKS[extras](url)
    finally:
        drop()
    print(f"ok: {extras} install", flush=True)


if __name__ == "__main__":
    main()
