"""Tasks of Django's task framework (``django.tasks`` of Django 6, or the django-tasks backport:
imported from delayq_transport/django/_framework.py, which picks it) on delayq's backend, for
tests/djtasks. A worker imports them by path; nothing imports this module without a framework.

Crash hooks, read from the environment when the module is imported (a worker's):

* ``DJANGO_TASKS_CRASH=claimed``: ``record``'s first attempt kills its worker (SIGKILL) before
  its effect; ``effect``: right after its effect (its ``TaskRun`` row, committed);
  ``recorded``: a ``task_finished`` receiver kills it right after the outcome was written
  (before the worker's batched ack reached the database);
* ``DJANGO_TASKS_RAISE=started`` / ``finished``: a receiver of that signal raises (for
  ``record``).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from django.db import connection

from delayq_transport.django._framework import (
    TaskContext,
    TaskResult,
    task,
    task_finished,
    task_started,
)
from delayq_transport.django.tasks import retry

from .models import Order, TaskRun

CRASH = os.environ.get("DJANGO_TASKS_CRASH", "")
RAISE = os.environ.get("DJANGO_TASKS_RAISE", "")
#: The advisory lock ``gate`` waits for (the test holds it until the task may finish).
GATE_LOCK = 4404


def _run(context: TaskContext, label: str) -> TaskRun:
    return TaskRun.objects.create(label=label, result_id=context.task_result.id,
                                  attempt=context.attempt, pid=os.getpid())


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@task(queue_name="mail", takes_context=True)
def spanned(context: TaskContext, seconds: float, delayq_limit_key: str | None = None) -> None:
    """Record when it ran on the database clock under ``<limit key>:<result id>`` (the spans
    table of tests/_spans.py; tests/djtasks/test_limits.py)."""
    import time

    with connection.cursor() as cur:
        cur.execute("INSERT INTO spans (task_id, pid) VALUES (%s, %s) RETURNING id",
                    [f"{delayq_limit_key}:{context.task_result.id}", os.getpid()])
        span = cur.fetchone()[0]
    time.sleep(seconds)
    with connection.cursor() as cur:
        cur.execute("UPDATE spans SET ended_ms = floor(extract(epoch FROM clock_timestamp())"
                    " * 1000)::bigint WHERE id = %s", [span])


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="mail")
def mail_add(a: int, b: int) -> int:
    return a + b


@task()
def fail(message: str) -> None:
    raise ValueError(message)


@task()
def unserialisable() -> object:
    return object()


@task()
def exits(message: str) -> None:
    raise SystemExit(message)


@task()
def interrupts(message: str) -> None:
    raise KeyboardInterrupt(message)


@task()
def nested_error(message: str) -> None:
    raise ValueError(ValueError(message))


@task()
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def record(context: TaskContext, label: str) -> str:
    if CRASH == "claimed" and context.attempt == 1:
        _die()
    _run(context, label)
    if CRASH == "effect" and context.attempt == 1:
        _die()
    return label


@task(takes_context=True)
@retry(2, backoff=0.2)
def flaky(context: TaskContext, label: str, fails: int) -> int:
    _run(context, label)
    if context.attempt <= fails:
        raise RuntimeError(f"{label}: attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
def gate(context: TaskContext, label: str) -> str:
    """Records its start, waits for the test's advisory lock (held until the test lets it
    finish), records its end."""
    _run(context, f"{label}:start")
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", [GATE_LOCK])
        cur.execute("SELECT pg_advisory_unlock(%s)", [GATE_LOCK])
    _run(context, f"{label}:end")
    return label


@task(takes_context=True)
def record_order(context: TaskContext, order_id: int) -> bool:
    found = Order.objects.filter(pk=order_id).exists()
    _run(context, f"order:{order_id}:{int(found)}")
    return found


def _raising(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
    if task_result.task.name == "record":
        raise RuntimeError(f"a task_{RAISE} receiver fails")


def _crash_after_outcome(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
    if task_result.task.name == "record" and task_result.attempts == 1:
        _die()


if RAISE in ("started", "finished"):
    (task_started if RAISE == "started" else task_finished).connect(
        _raising, dispatch_uid="shop.djtasks.raising")
if CRASH == "recorded":
    task_finished.connect(_crash_after_outcome, dispatch_uid="shop.djtasks.crash")
