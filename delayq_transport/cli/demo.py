"""``delayq demo``: a Celery worker on the delayq broker, a few countdowns and a retry, live.

With no database configured it starts the embedded PostgreSQL (``delayq[embedded]``) in a
per-user data directory and says where. The live view reads the queue table itself, so what
it shows as "scheduled" is exactly what no worker holds yet.

Pointed at a real database it touches nothing of the user's: it works in a queue table of its
own (``delayq_demo``, core/ledgers/demo_tables.py), its worker consumes only the demo's
queue there, and a second demo on the same database is refused while one runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.live import Live
from rich.table import Table

from ..commands import Context, console, register
from ..core.db import Database, mask_password
from ..core.ledgers import DEMO_QUEUE, DEMO_TABLE, DemoSite, RunLog, demo_tables
from ..core.queue import DelayedQueue
from . import embedded

COUNTDOWNS_S = (1, 2, 3, 5, 8)
RETRY_AFTER_S = 3
DEMO_TIMEOUT_S = 60.0
STATE_STYLE = {"scheduled": "yellow", "running": "cyan", "retrying": "magenta", "done": "green"}


@dataclass
class DemoTask:
    """One task as the view shows it: when its current run was due and when that run started.

    Lateness is start minus due: the task's own work (``remind`` sleeps 0.5 s) is not lateness.
    A retry's due time is the retry's own ``scheduledAt``, read while its row waits."""

    task_id: str
    label: str
    eta: datetime
    state: str = "scheduled"
    started_at: datetime | None = None


def _start_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    log_file = open(log_path, "wb")  # noqa: SIM115 - lives as long as the worker
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "delayq_transport.cli.demo_app", "worker",
         "-P", "solo", "--loglevel=INFO", "-n", f"demo-{os.getpid()}@%h", "-Q", DEMO_QUEUE],
        env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
    )


def _wait_ready(proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "ready." in log_path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            click.echo(log_path.read_text(errors="replace")[-2000:], err=True)
            raise click.ClickException(f"the demo's worker exited before it was ready (its "
                                       f"log, above: {log_path})")
        time.sleep(0.1)
    raise click.ClickException(f"worker not ready after {timeout}s; log: {log_path}")


def _refresh(tasks: list[DemoTask], queue: DelayedQueue, log: RunLog) -> None:
    runs = log.steps()
    latest = {task_id: (state, at) for task_id, state, at in runs}
    started = {task_id: at for task_id, state, at in runs if state == "running"}
    for task in tasks:
        row = queue.get(task.task_id)
        state, _at = latest.get(task.task_id, ("scheduled", None))
        if row is not None and not row.in_flight:
            task.eta = row.scheduled_at  # the waiting run's due time (a retry has its own)
        if state == "retrying" and row is not None and not row.in_flight:
            state = "scheduled (retry)"
            task.started_at = None
        elif state in ("running", "done"):
            task.started_at = started.get(task.task_id)
        task.state = state


def _view(tasks: list[DemoTask], now: datetime) -> Table:
    table = Table(title=f"delayq demo: tasks wait in PostgreSQL until due ({now:%H:%M:%S})")
    for col in ("task", "due", "started", "started after due", "state"):
        table.add_column(col)
    for t in tasks:
        style = STATE_STYLE.get(t.state.split(" ")[0], "white")
        started = "-" if t.started_at is None else _clock(t.started_at)
        late = "-" if t.started_at is None else \
            f"{(t.started_at - t.eta).total_seconds() * 1000:.0f} ms"
        table.add_row(t.label, _clock(t.eta), started, late, f"[{style}]{t.state}[/{style}]")
    return table


def _clock(at: datetime) -> str:
    return f"{at:%H:%M:%S.%f}"[:-3]


def _start_web(queue: DelayedQueue, port: int) -> Any:
    """``delayq web`` in a thread for the demo (None without the web extra); any free port if
    ``port`` is taken."""
    try:
        from ..web.security import WebConfig
        from ..web.server import BackgroundServer
    except ImportError:
        console.print("(install delayq[web] to watch the demo in a browser)")
        return None
    for candidate in dict.fromkeys([port, 0]):
        try:
            return BackgroundServer(queue, WebConfig(port=candidate, refresh_s=0.5)).start()
        except RuntimeError:
            continue
    return None


@click.command("demo")
@click.option("--keep-worker", is_flag=True, help="Leave the worker running after the demo.")
@click.option("--web/--no-web", default=True, show_default=True,
              help="Serve the web page during the demo and print its URL.")
@click.option("--web-port", default=8377, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the web page")
@click.option("--linger", type=click.FloatRange(0, 3600), default=None,
              help="Seconds to keep the page up after the demo (default: 20 on a terminal)")
@click.pass_obj
def demo(obj: Context, keep_worker: bool, web: bool, web_port: int,
         linger: float | None) -> None:
    """Run a Celery worker on delayq and watch countdown tasks go scheduled -> running -> done.
    The demo works in tables of its own (delayq_demo and its companions) and touches nothing
    else in the database; it refuses to run while another demo runs on the same database."""
    url = obj.database_url
    if not url:
        url, _server = embedded.start()
        console.print(f"no database configured: started embedded PostgreSQL in "
                      f"[bold]{embedded.default_data_dir()}[/bold] ({url})")
    console.print(f"database: {mask_password(url)}; the demo works in tables of its own "
                  f"({', '.join(demo_tables())}) and touches nothing else")
    with Database(url, max_size=2) as db, DemoSite(db) as site:
        site.prepare()
        _demo(url, keep_worker, web, web_port, linger)


def _demo(url: str, keep_worker: bool, web: bool, web_port: int, linger: float | None) -> None:
    """The demo proper, run while its claim on the database is held."""
    env = dict(os.environ, DELAYQ_DEMO_DB=url,
               DELAYQ_DEMO_BROKER="delayq+postgresql://localhost/postgres")
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"delayq-demo-worker-{os.getpid()}.log"
    with DelayedQueue(url, table=DEMO_TABLE, kind=DEMO_QUEUE) as queue:
        queue.purge()  # the demo's own queue: what an interrupted earlier demo left waiting
        worker = _start_worker(env, log_path)
        server = _start_web(queue, web_port) if web else None
        try:
            if server is not None:
                console.print(f"web page: [bold]{server.url}/[/bold]")
            _wait_ready(worker, log_path)
            console.print(f"worker ready (log: {log_path})")
            _run(queue, url, env, server.url if server else None)
            if server is not None:
                _linger(sys.stdout.isatty() and 20.0 if linger is None else linger)
        finally:
            if server is not None:
                server.stop()
            if not keep_worker and worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=30)


def _linger(seconds: float) -> None:
    if seconds <= 0:
        return
    console.print(f"the page stays up {seconds:.0f} s more (Ctrl-C to stop)")
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        pass


def _run(queue: DelayedQueue, url: str, env: dict[str, str], web_url: str | None) -> None:
    from .demo_app import app, flaky, remind

    os.environ["DELAYQ_DEMO_DB"] = url  # the tasks' _record() in this process, if any
    app.conf.broker_url = env["DELAYQ_DEMO_BROKER"]
    app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                         "database_url": url}

    ids = [str(uuid.uuid4()) for _ in range(len(COUNTDOWNS_S) + 1)]
    if web_url:
        console.print(f"watch them go scheduled -> done: [bold]{web_url}/watch?ids="
                      f"{','.join(ids)}[/bold]")
    tasks = []
    for i, seconds in enumerate(COUNTDOWNS_S):
        result = remind.apply_async((f"user-{i}",), countdown=seconds, task_id=ids[i])
        tasks.append(DemoTask(result.id, f"remind(user-{i}) countdown={seconds}s",
                              queue.get(result.id).scheduled_at))  # type: ignore[union-attr]
    result = flaky.apply_async(("user-retry",), countdown=1, task_id=ids[-1])
    tasks.append(DemoTask(result.id, f"flaky: fails, retry(countdown={RETRY_AFTER_S})",
                          queue.get(result.id).scheduled_at))  # type: ignore[union-attr]
    deadline = time.monotonic() + DEMO_TIMEOUT_S
    # On a terminal the table changes in place; in a log (CI, `> file`) it is printed once, at
    # the end: rich's live view would print only its last frame there anyway, without the line
    # break that separates it from the summary below.
    live = Live(console=console, refresh_per_second=8) if console.on_terminal else None
    with Database(url, max_size=1) as db, live or contextlib.nullcontext():
        log = RunLog(db)
        while time.monotonic() < deadline:
            _refresh(tasks, queue, log)
            if live is not None:
                live.update(_view(tasks, queue.now()))
            if all(t.state == "done" for t in tasks):
                break
            time.sleep(0.1)
    if live is None:
        console.print(_view(tasks, queue.now()))
    done = sum(t.state == "done" for t in tasks)
    late = [(t.started_at - t.eta).total_seconds() * 1000 for t in tasks if t.started_at]
    console.print(f"{done}/{len(tasks)} tasks done, each started "
                  f"{min(late, default=0):.0f}-{max(late, default=0):.0f} ms after it was due; "
                  "the worker never held a task before it was due.")
    if done != len(tasks):
        raise click.ClickException("demo did not finish in time; see the worker log")


register(demo)
