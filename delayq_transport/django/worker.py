"""The worker of ``django.tasks`` on delayq (``manage.py delayq_worker``): a thin front end on
the core's consumer session (core/queue/session.py), as Dramatiq's consumer is.

One process holds one :class:`Worker`: one subscription of one session over every kind of its
queues (highest priority first, across the queues, in one poll), a window of ``threads``
deliveries, and ``threads`` threads that run them. The session reads LISTEN (a task enqueued
anywhere wakes an idle worker at once), extends the lease of every task held while it runs,
deletes acks in batches and runs the results' pruning; the worker decodes, records each attempt
(core/task_results.py) and settles:

* success: outcome SUCCESSFUL written, then the row acked;
* failure with retries left: the error written (status READY), the row released to be due
  again after the backoff (a redelivery of the same row: no copy);
* failure without: FAILED written, then acked; ``task_finished`` is sent for final outcomes;
* a crash (the process killed): the row's lease lapses, another worker takes it and runs it
  again (at least once); a row whose outcome was written before the crash is only acked.
  Meanwhile its result reads READY, interrupted (:mod:`.attempts`: each running attempt's
  liveness is touched in the database), and the next claim records the interrupted attempt.

Async tasks (``async def``) run on one event loop per process, on a thread of its own; the
thread that took the task waits for it, so ``threads`` bounds sync and async tasks alike.

Graceful shutdown (SIGTERM, SIGINT): no more polls; rows taken but not started are given back
at once; running tasks get ``shutdown_timeout`` seconds to finish; what still runs then is given
back (it runs again elsewhere; its result reads READY with the interruption recorded,
:mod:`.attempts`) and the process exits.

The process around it (signals; ``--processes N``): :mod:`.supervisor`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from inspect import iscoroutinefunction
from queue import Empty, SimpleQueue
from typing import Any

from django.db import close_old_connections

from ..core import (
    Database,
    DatabaseError,
    DatabaseUnavailable,
    DelayedQueue,
    Envelope,
    Listener,
    Session,
    Subscription,
    TaskResults,
)
from ..core.schema import wait_for_schema
from ..formats import deadletters, queues
from ..formats.django_tasks import KIND_PREFIX, TASK_FIELDS
from ._framework import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from .attempts import Attempts
from .backend import (
    DelayqBackend,
    errors_of,
    from_ms,
    kind_of,
    kinds_for,
    now_ms,
    storable,
    task_of,
)
from .periodic import Scheduler, misfired_occurrences

log = logging.getLogger(__name__)

#: How often a worker deletes results past the retention (every worker does; cheap when
#: there is nothing to delete).
PRUNE_INTERVAL_S = 300.0
#: Polls between a failed one (database unreachable) and the next.
ERROR_PAUSE_S = 1.0
#: A task whose outcome could not be written (the database failed) is due again this late.
SETTLE_RETRY_S = 5.0
#: Frames of a failed task's traceback kept.
TRACEBACK_LIMIT = 30


#: Seconds between scans of the kinds that hold rows (:class:`LiveKinds`) besides wake-ups.
RESCAN_S = 5.0
#: What starts the kind of a search marker in a wake-up (core/announce.py): rows of that kind.
_MARKER = "\x1e"


class LiveKinds:
    """The kinds a worker polls, of all its kinds (each queue at each of 201 priorities, in
    the order it takes them): those known to hold rows. A poll over every kind pays one index
    descent per kind (1.6 ms for two queues' 402 kinds, 0.15 ms for 2); the kinds in use are
    few. A kind becomes live when a scan of the table's kinds finds it (at start, every
    RESCAN_S, and whenever wake-ups may have been missed: LISTEN (re)connected) or a wake-up
    names it; it stays live. When LISTEN cannot deliver (a transaction pooler), every kind is
    polled."""

    def __init__(self, kinds: list[str], scan: Callable[[], list[str]]) -> None:
        self.all = list(kinds)
        self._known = frozenset(kinds)
        self._scan = scan
        self._live: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        #: Wake-ups cannot be heard: poll every kind.
        self.everything = False

    def rescan(self) -> None:
        found = self._known.intersection(self._scan())
        with self._lock:
            self._live = self._live | found

    def heard(self, kind: str) -> None:
        kind = kind.removeprefix(_MARKER)
        if kind in self._known and kind not in self._live:
            with self._lock:
                self._live = self._live | {kind}

    def order(self) -> list[str]:
        if self.everything:
            return self.all
        live = self._live
        return [k for k in self.all if k in live] or self.all[:1]


class WatchedQueue:
    """The worker's queue as its session sees it: the kinds its wake-ups name become live, and
    a wake-up that may have been missed rescans (see :class:`LiveKinds`)."""

    def __init__(self, queue: DelayedQueue, live: LiveKinds) -> None:
        self.queue = queue
        self.live = live
        self.lease_ms = queue.lease_ms

    def poll(self, n: int, kinds: Sequence[str] | None = None
             ) -> tuple[list[Envelope], int | None]:
        return self.queue.poll(n, kinds)

    def ack_many(self, deliveries: Iterable[Envelope | tuple[int, str]]) -> int:
        return self.queue.ack_many(deliveries)

    def release(self, deliveries: Iterable[Envelope | tuple[int, str]], delay: float = 0
                ) -> int:
        return self.queue.release(deliveries, delay)

    def extend_lease(self, locks: Iterable[str]) -> int:
        return self.queue.extend_lease(locks)

    def lower_watermark(self, kind: str, at_ms: int) -> None:
        self.live.heard(kind)
        self.queue.lower_watermark(kind, at_ms)

    def reset_watermarks(self) -> None:
        self.queue.reset_watermarks()
        self.live.rescan()

    def disable_watermarks(self) -> None:
        self.queue.disable_watermarks()
        self.live.everything = True

    def __getattr__(self, name: str) -> Any:  # what the session's dead-lettering reads
        return getattr(self.queue, name)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def error_of(exc: BaseException) -> dict[str, str]:
    """The attempt's error as Django's ``TaskError`` has it: class path and traceback."""
    kind = type(exc)
    return {"exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
            "traceback": "".join(traceback.format_exception(exc, limit=TRACEBACK_LIMIT))}


class Worker:
    """Runs the tasks of ``queue_names`` on ``threads`` threads until :meth:`stop`."""

    def __init__(self, backend: DelayqBackend, *, queue_names: list[str] | None = None,
                 threads: int = 4, shutdown_timeout: float = 30.0,
                 worker_id: str | None = None, schedule: bool = True) -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.backend = backend
        self.queue_names = list(queue_names or backend.queue_names())
        self.threads = threads
        self.shutdown_timeout = float(shutdown_timeout)
        self.worker_id = worker_id or default_worker_id()
        self.db = Database(backend.url(), min_size=0, max_size=threads + 4)
        try:
            wait_for_schema(self.db, backend.table, timeout_s=backend.schema_wait,
                            also=" (Django: `manage.py delayq_migrate`)")
            self.queue = DelayedQueue(
                self.db, kind=kind_of(self.queue_names[0], 0), table=backend.table,
                acquire_timeout=backend.lease, ensure_schema=False,
                relaxed_consumer_commits=True, low_watermark=True, naming=queues)
        except BaseException:
            self.db.close()
            raise
        self.results = TaskResults(self.queue, KIND_PREFIX)
        #: The attempts running here, as their results show them (touched while they run).
        self.attempts = Attempts(self.results, self.worker_id, backend.lease, now_ms)
        self.kinds = kinds_for(self.queue_names)
        #: The kinds polled: those holding rows (a scan now and then, and wake-ups).
        self.live = LiveKinds(self.kinds, self.results.kinds)
        jobs: list[tuple[float, Callable[[], object]]] = [
            (RESCAN_S, self.live.rescan), (self.attempts.touch_interval_s, self.attempts.touch),
            deadletters.expiry_job(self.queue, backend.dead_letter_retention)]
        if backend.result_retention is not None:
            jobs.append((PRUNE_INTERVAL_S, self.prune))
        self.session = Session(
            WatchedQueue(self.queue, self.live),
            listen=lambda: Listener(self.db, self.queue.queries),
            polling_interval=backend.polling_interval, unheard_polling_interval=0.5,
            misfired=misfired_occurrences(self.queue), listen_on_thread=True, jobs=jobs)
        #: Installs the backend's periodic tasks (none declared, or ``schedule=False``: None).
        self.scheduler = Scheduler(
            self.db, self.queue, backend.periodic, source=backend.periodic_source,
            alias=backend.alias, refresh_interval=backend.periodic_refresh,
        ) if schedule and backend.schedules else None
        self._event = threading.Event()
        self._stopping = threading.Event()
        self._work: SimpleQueue[Envelope | None] = SimpleQueue()
        self._sub: Subscription | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Tasks run to an outcome by this worker (tests and the exit line read it).
        self.done = 0
        self.ready = threading.Event()
        #: Called on the dispatcher's thread once it stopped taking tasks (the command's line).
        self.on_stop: Callable[[], None] | None = None

    # -- the dispatcher (the caller's thread) --------------------------------------------

    def run(self) -> bool:
        """Poll and run until :meth:`stop`; then shut down. True: every task taken finished
        (False: some were given back when ``shutdown_timeout`` ran out)."""
        self.live.rescan()
        sub = self._sub = self.session.subscribe(self.kinds, window=self.threads,
                                                 signal=self._event.set, order=self.live.order)
        threads = [threading.Thread(target=self._run_tasks, name=f"delayq-task-{i}",
                                    daemon=True) for i in range(self.threads)]
        for thread in threads:
            thread.start()
        if self.scheduler is not None:
            self.scheduler.start()
        self.ready.set()
        try:
            while not self._stopping.is_set():
                try:
                    envs = self.session.poll(sub)
                except (DatabaseUnavailable, DatabaseError) as exc:
                    log.warning("delayq: poll failed, again in %.0f s: %s", ERROR_PAUSE_S, exc)
                    self._stopping.wait(ERROR_PAUSE_S)
                    continue
                for env in envs:
                    self._work.put(env)
                if envs:
                    continue
                self._event.wait(sub.wait_s())
                self._event.clear()
        finally:
            if self.on_stop is not None:
                self.on_stop()
            finished = self._shutdown(threads)
        return finished

    def stop(self) -> None:
        """Stop taking tasks and shut down (safe from a signal handler)."""
        self._stopping.set()
        self._event.set()

    def _shutdown(self, threads: list[threading.Thread]) -> bool:
        sub = self._sub
        assert sub is not None
        if self.scheduler is not None:
            self.scheduler.stop()
        # Taken but not started: given back at once, due again for any worker.
        waiting: list[Envelope] = []
        while True:
            try:
                env = self._work.get_nowait()
            except Empty:
                break
            if env is not None:
                waiting.append(env)
        for _ in threads:
            self._work.put(None)
        try:
            if waiting:
                self.session.release(sub, waiting)
        except (DatabaseUnavailable, DatabaseError) as exc:
            log.warning("delayq: could not give back %d tasks (they run again when their "
                        "lease ends): %s", len(waiting), exc)
        deadline = time.monotonic() + self.shutdown_timeout
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        running = sum(t.is_alive() for t in threads)
        if running:
            log.warning("delayq: %d tasks still running after %.0f s: given back, they run "
                        "again on another worker", running, self.shutdown_timeout)
            self.attempts.give_back(self.attempts.running(), f"its worker shut down and its "
                                    f"shutdown timeout ({self.shutdown_timeout:g} s) ran out")
        try:
            self.session.unsubscribe(sub)  # acks flushed, whatever is still held given back
        except (DatabaseUnavailable, DatabaseError) as exc:
            log.warning("delayq: could not settle on the way out: %s", exc)
        self.session.close()
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if not running:
            self.queue.close()
            self.db.close()
        return not running

    # -- the task threads ----------------------------------------------------------------

    def _run_tasks(self) -> None:
        while (env := self._work.get()) is not None:
            try:
                self.execute(env)
            except Exception:
                log.exception("delayq: task %s could not be settled; it is given back and "
                              "runs again in %.0f s", env.key, SETTLE_RETRY_S)
                self._give_back(env)
            finally:
                self.attempts.end(env.key)

    def _give_back(self, env: Envelope) -> None:
        """Due again later; if even that fails, no longer held (so no longer extended): its
        lease ends and another worker takes it."""
        sub = self._sub
        assert sub is not None
        self.attempts.give_back([env.key], "its outcome could not be written",
                                SETTLE_RETRY_S)
        try:
            self.session.release(sub, [env], delay=SETTLE_RETRY_S)
        except (DatabaseUnavailable, DatabaseError) as exc:
            log.warning("delayq: could not give back task %s (its lease ends): %s", env.key,
                        exc)

    def execute(self, env: Envelope) -> None:
        """Run one delivered task and settle its row (see the module docstring)."""
        sub = self._sub
        assert sub is not None
        try:
            data = json.loads(env.payload)
            if not isinstance(data, dict) or not TASK_FIELDS <= data.keys():
                raise ValueError(f"not an object with {', '.join(sorted(TASK_FIELDS))}")
        except ValueError as exc:
            retention = self.backend.dead_letter_retention
            log.error("delayq: row %s of kind %s is not a task (%s): moved to kind %s, kept "
                      "%g s", env.id, env.kind, exc, deadletters.DJANGO_KIND, retention)
            self.session.dead_letter(sub, [env], deadletters.DJANGO_KIND, retention, [None])
            return
        attempt = self.attempts.begin(env.key, env.payload.decode(), data.get("enqueued_at"),
                                      now_ms())
        if attempt is None:  # its outcome was written before a crash: settled, not re-run
            self.session.ack(sub, [env])
            return
        try:
            task = task_of(data)
        except Exception as exc:  # the task's code is gone or broken: nothing to retry
            log.error("delayq: task %s (%s) cannot be loaded: %s", env.key, data.get("task"),
                      exc)
            self.results.finish(env.key, TaskResultStatus.FAILED.value, now_ms(),
                                finished=True, error=error_of(exc))
            self.session.ack(sub, [env])
            return
        result = TaskResult(
            task=task, id=env.key, status=TaskResultStatus.RUNNING,
            enqueued_at=from_ms(data.get("enqueued_at")),
            started_at=from_ms(attempt.started_at_ms), finished_at=None,
            last_attempted_at=from_ms(now_ms()), args=data["args"], kwargs=data["kwargs"],
            backend=data["backend"], errors=errors_of(attempt.errors),
            worker_ids=attempt.worker_ids)
        sender = type(self.backend)
        close_old_connections()
        try:
            task_started.send_robust(sender, task_result=result)
            try:
                value = storable(normalize_json(self._call(task, result)))
                return_json = json.dumps(value, allow_nan=False)  # jsonb has no NaN
            except BaseException as exc:  # SystemExit and KeyboardInterrupt are the task's
                self._failed(env, task, result, exc, sender)
                return
            at = now_ms()
            try:
                self.results.finish(env.key, TaskResultStatus.SUCCESSFUL.value, at,
                                    finished=True, return_json=return_json)
            except DatabaseError as exc:  # a value JSON holds and jsonb refuses
                self._failed(env, task, result, exc, sender, retry=False)
                return
            self.session.ack(sub, [env])
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
            object.__setattr__(result, "finished_at", from_ms(at))
            object.__setattr__(result, "_return_value", value)
            self.done += 1
            task_finished.send_robust(sender, task_result=result)
        finally:
            close_old_connections()

    def _failed(self, env: Envelope, task: Task, result: TaskResult, exc: BaseException,
                sender: type, *, retry: bool = True) -> None:
        sub = self._sub
        assert sub is not None
        error = error_of(exc)
        attempts = len(result.worker_ids)
        at = now_ms()
        result.errors.append(TaskError(**error))
        if retry and attempts <= self.backend.retries_of(task):
            delay = self.backend.backoff_s(task, attempts)
            self.results.finish(env.key, TaskResultStatus.READY.value, at, finished=False,
                                error=error)
            self.session.release(sub, [env], delay=delay)
            log.warning("delayq: task %s (%s) failed attempt %d (%s), retrying in %.1f s",
                        env.key, task.module_path, attempts, error["exception_class_path"],
                        delay)
            return
        self.results.finish(env.key, TaskResultStatus.FAILED.value, at, finished=True,
                            error=error)
        self.session.ack(sub, [env])
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", from_ms(at))
        self.done += 1
        task_finished.send_robust(sender, task_result=result)  # inside the except: exc_info

    def _call(self, task: Task, result: TaskResult) -> Any:
        args = list(result.args)
        if task.takes_context:
            args.insert(0, TaskContext(task_result=result))
        if iscoroutinefunction(task.func):
            return asyncio.run_coroutine_threadsafe(task.func(*args, **result.kwargs),
                                                    self.event_loop()).result()
        return task.func(*args, **result.kwargs)

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The process' event loop for async tasks, started on first use."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="delayq-asyncio",
                                 daemon=True).start()
                self._loop = loop
            return self._loop

    # -- maintenance (the session's thread) ------------------------------------------------

    def prune(self) -> int:
        retention = self.backend.result_retention
        if retention is None:
            return 0
        return self.results.prune(now_ms() - int(retention * 1000))
