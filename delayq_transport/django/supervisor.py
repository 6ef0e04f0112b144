"""The process around a ``django.tasks`` worker (``manage.py delayq_worker``): SIGTERM and
SIGINT stop it gracefully, and with ``--processes N`` a supervisor keeps N of them running.

Apart from :mod:`.worker` because it is another concern: the worker is a thread pool over the
session's take, which tests and benches run in their own process on a thread; this module owns
the process, its signals and its children, which only the command needs.

``processes`` > 1: a parent starts that many worker processes (spawned, each a whole
:class:`~.worker.Worker`), starts another when one dies (after RESTART_PAUSE_S when it died
that soon after it started), and passes SIGTERM/SIGINT on.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .backend import DelayqBackend
from .worker import Worker

log = logging.getLogger(__name__)

#: A worker process that dies sooner than this after it started is started again only after it.
RESTART_PAUSE_S = 5.0


class Signals:
    """SIGTERM and SIGINT as an event threads can wait on. The handler only sends a byte to a
    socket (what a signal handler may safely do): setting an ``Event`` there could deadlock
    with the interrupted thread holding the event's lock."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._w.setblocking(False)
        self.received = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = True
        try:
            self._w.send(b"\0")
        except OSError:  # full of earlier signals: one is enough
            pass

    @property
    def readable(self) -> socket.socket:
        """Readable once a signal came (for ``multiprocessing.connection.wait``)."""
        return self._r

    def wait(self) -> None:
        """Block until a signal came."""
        self._r.recv(1)


def serve(backend: DelayqBackend, *, queue_names: list[str] | None, threads: int,
          shutdown_timeout: float, schedule: bool = True,
          on_ready: Callable[[Worker], None] | None = None,
          on_stop: Callable[[], None] | None = None) -> bool:
    """Run one worker in this process until SIGTERM or SIGINT (main thread only)."""
    worker = Worker(backend, queue_names=queue_names, threads=threads,
                    shutdown_timeout=shutdown_timeout, schedule=schedule)
    worker.on_stop = on_stop
    signals = Signals()

    def stop_on_signal() -> None:
        signals.wait()
        worker.stop()

    threading.Thread(target=stop_on_signal, name="delayq-signals", daemon=True).start()
    if on_ready is not None:
        announce = on_ready

        def when_ready() -> None:
            if worker.ready.wait():
                announce(worker)

        threading.Thread(target=when_ready, name="delayq-ready", daemon=True).start()
    return worker.run()


def _child(settings_module: str, alias: str, queue_names: list[str] | None, threads: int,
           shutdown_timeout: float, schedule: bool) -> None:
    """A spawned worker process: Django set up as the parent's, then one worker."""
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    import django

    django.setup()
    from ._framework import task_backends

    backend = task_backends[alias]
    assert isinstance(backend, DelayqBackend)
    finished = serve(backend, queue_names=queue_names, threads=threads,
                     shutdown_timeout=shutdown_timeout, schedule=schedule,
                     on_ready=lambda w: print(f"delayq: worker {w.worker_id} ready", flush=True),
                     on_stop=lambda: print("delayq: worker stopping", flush=True))
    os._exit(0 if finished else 1)  # tasks given back may still run on daemon threads


def supervise(processes: int, *, settings_module: str, alias: str,
              queue_names: list[str] | None, threads: int, shutdown_timeout: float,
              schedule: bool = True) -> bool:
    """Run ``processes`` worker processes until SIGTERM or SIGINT; one that dies is replaced
    (after RESTART_PAUSE_S when it died that soon after it started). True when every process
    stopped with its tasks finished: the command then exits as one worker process would (1
    when any gave a running task back), so a deploy script reads the same status for any
    ``--processes``."""
    ctx = multiprocessing.get_context("spawn")
    signals = Signals()
    args = (settings_module, alias, queue_names, threads, shutdown_timeout, schedule)
    procs: list[Any] = [None] * processes
    due = [0.0] * processes  # when each slot (re)starts; inf: running

    def start(i: int) -> None:
        proc = ctx.Process(target=_child, args=args, name=f"delayq-worker-{i}")
        proc.start()
        procs[i], due[i] = proc, float("inf")

    started = [0.0] * processes
    while not signals.received:
        now = time.monotonic()
        for i in range(processes):
            if due[i] <= now:
                start(i)
                started[i] = now
        running = [p.sentinel for p in procs if p is not None and p.is_alive()]
        pending = [d - now for d in due if d != float("inf")]
        multiprocessing.connection.wait([signals.readable, *running],
                                        timeout=max(min(pending, default=1.0), 0.0))
        for i, proc in enumerate(procs):
            if signals.received or proc is None or proc.is_alive() or due[i] != float("inf"):
                continue
            soon = time.monotonic() - started[i] < RESTART_PAUSE_S
            log.warning("delayq: worker process %s exited (status %s): starting another%s",
                        proc.pid, proc.exitcode, f" in {RESTART_PAUSE_S:.0f} s" if soon else "")
            due[i] = time.monotonic() + (RESTART_PAUSE_S if soon else 0.0)
    for proc in procs:
        if proc is not None and proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + shutdown_timeout + 10
    for proc in procs:
        if proc is not None:
            proc.join(max(deadline - time.monotonic(), 0.0))
    for proc in procs:
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join()
    return all(proc is None or proc.exitcode == 0 for proc in procs)
