"""The systems the harness runs: one row each, and how a row becomes processes.

A system is a task framework (its app in ``apps/``) on a broker, with the options that make it
this row. ``config`` is what the page states about its configuration, ``durability`` when a
returned publish survives a crash of the broker (the page pairs delayq's publish modes with
RabbitMQ's by it, :data:`CRASH_SAFE`); both are stored in every record the system makes.
``limit`` marks a ceiling rather than something to deploy: each framework on its in-memory
broker (what the framework alone costs: the producer runs in the worker process,
:func:`apps.report.serve_in_process`), and one process COPYing rows (the ``copy`` framework).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Brokers whose state is a fresh PostgreSQL database per run.
DATABASE_BROKERS = frozenset({"delayq", "postgres", "pgqueuer", "procrastinate", "db", "ox",
                              "psql", "copy"})
REDIS_BROKER_URL = "redis://127.0.0.1:6379/7"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
RELAXED = "options=-c%20synchronous_commit%3Doff"
CELERY_READY = "bench: worker ready"
#: Worker layout (processes, concurrency each) of a framework unless a row or scenario says.
LAYOUTS = {"celery": (1, 2), "dramatiq": (2, 8), "procrastinate": (1, 4), "pgqueuer": (1, 0),
           "django": (1, 0)}


@dataclass(frozen=True)
class System:
    name: str
    label: str
    framework: str
    broker: str
    options: Mapping[str, Any] = field(default_factory=dict)
    worker: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    config: str = ""
    durability: str = ""
    layout: tuple[int, int] | None = None
    relaxed: bool = False
    limit: bool = False
    #: ``pgbouncer``: the app's connections go through a PgBouncer in transaction pooling
    #: started for the run (``pgbouncer-listen``: with a direct ``listen_url`` for wake-ups).
    via: str = ""

    @property
    def delayq(self) -> bool:
        """Runs delayq's code: the rows a run against another revision repeats."""
        return self.broker == "delayq"

    @property
    def database(self) -> bool:
        return self.broker in DATABASE_BROKERS

    @property
    def inproc(self) -> bool:
        return self.broker in ("memory", "stub")

    def settings(self) -> dict[str, Any]:
        """What a record says about the system that made it."""
        out: dict[str, Any] = {"label": self.label, "framework": self.framework,
                               "broker": self.broker, "config": self.config}
        if self.durability:
            out["durability"] = self.durability
        if self.options:
            out["options"] = dict(self.options)
        return out


COMMIT = "once committed, before PostgreSQL flushes the WAL to disk"
FLUSH = "once the WAL is flushed to disk"
SOCKET = "once written to the socket, before RabbitMQ has it"
CONFIRM = "once RabbitMQ confirmed it (publisher confirms)"
REDIS = "once Redis has it in memory (its default persistence: a snapshot now and then)"
#: What a crash of the broker does to a publish that returned, by its ``durability``: the
#: pages pair delayq's publish modes with another broker's by this (render.peer), never by hand.
CRASH_SAFE = {COMMIT: False, FLUSH: True, SOCKET: False, CONFIRM: True, REDIS: False}

#: Django's connection pool (``DATABASES["default"]["OPTIONS"]["pool"]``), the peers' advice.
POOL = {"BENCH_DJANGO_POOL": "1"}

SYSTEMS: tuple[System, ...] = (
    System("celery-delayq", "delayq", "celery", "delayq", durability=COMMIT,
           config="transport options at their defaults"),
    System("celery-delayq-durable", "delayq, `durable_publish`", "celery", "delayq",
           {"durable_publish": True}, durability=FLUSH, config="`durable_publish=True`"),
    System("celery-delayq-pgbouncer", "delayq through PgBouncer", "celery", "delayq",
           durability=COMMIT, via="pgbouncer",
           config="PgBouncer 1.18 in transaction pooling on the same machine, no LISTEN "
                  "through it: a task published for now waits for the next poll, every "
                  "`unheard_polling_interval` (0.5 s)"),
    System("celery-delayq-pgbouncer-listen", "delayq through PgBouncer, `listen_url`",
           "celery", "delayq", durability=COMMIT, via="pgbouncer-listen",
           config="the same, wake-ups on a direct `listen_url`"),
    System("celery-redis", "Redis", "celery", "redis", durability=REDIS,
           config="transport options at their defaults"),
    System("celery-rabbitmq", "RabbitMQ", "celery", "rabbitmq", durability=SOCKET,
           config="transport options at their defaults"),
    System("celery-rabbitmq-confirm", "RabbitMQ, `confirm_publish`", "celery", "rabbitmq",
           {"confirm_publish": True}, durability=CONFIRM, config="`confirm_publish=True`"),
    System("celery-memory", "kombu `memory://`", "celery", "memory", limit=True,
           config="the producer a thread of the worker's main process"),
    System("dramatiq-delayq", "delayq", "dramatiq", "delayq", durability=COMMIT,
           config="`DelayqBroker(url)`"),
    System("dramatiq-redis", "Redis", "dramatiq", "redis", durability=REDIS,
           config="`RedisBroker(url)`"),
    System("dramatiq-rabbitmq", "RabbitMQ", "dramatiq", "rabbitmq", durability=SOCKET,
           config="`RabbitmqBroker(url)` (`confirm_delivery=False`, its default)"),
    System("dramatiq-postgres", "dramatiq-postgres", "dramatiq", "postgres",
           config="`PostgresBroker(url, results=False)`"),
    System("dramatiq-stub", "Dramatiq `StubBroker`", "dramatiq", "stub", layout=(1, 8),
           limit=True, config="1 process × 8 threads, the producer a thread of it"),
    System("django-delayq", "delayq", "django", "delayq", worker=("delayq_worker",),
           durability=COMMIT, config="`manage.py delayq_worker` at its defaults: 4 threads, "
                                     "woken by LISTEN/NOTIFY, `LEASE` 60 s"),
    System("django-delayq-tuned", "delayq, tuned", "django", "delayq", {"LEASE": 15},
           worker=("delayq_worker",), env=POOL, durability=COMMIT,
           config="`LEASE` 15 s, Django's connection pool"),
    System("django-tasks-db", "django-tasks-db 0.13", "django", "db", worker=("db_worker",),
           config="`manage.py db_worker` at its defaults: one task at a time, a poll every "
                  "second when idle, no recovery of a killed worker's task (its issue #5)"),
    System("django-ox", "django-ox 1.9", "django", "ox", worker=("ox_worker",),
           config="`manage.py ox_worker` at its defaults: `--concurrency 1`, a poll every "
                  "`--interval` 1 s when idle, `LOCK_TIMEOUT` 300 s"),
    System("django-ox-tuned", "django-ox 1.9, tuned", "django", "ox", {"LOCK_TIMEOUT": 15},
           worker=("ox_worker", "--concurrency", "4"), env=POOL,
           config="`--concurrency 4`, `LOCK_TIMEOUT` 15 s (its own kill benchmark's), "
                  "Django's connection pool (its production guide)"),
    System("django-task-psql", "django-task-psql 0.2", "django", "psql",
           worker=("runworker",),
           config="`manage.py runworker` at its defaults: concurrency 1, LISTEN/NOTIFY with a "
                  "poll every `TASK_WORKER_HEARTBEAT_S` 5 s (deferred tasks), a task left "
                  "`RUNNING` made `READY` again by a worker that starts "
                  "`TASK_WORKER_STALE_MINUTES` (5) later"),
    System("django-task-psql-tuned", "django-task-psql 0.2, tuned", "django", "psql",
           worker=("runworker", "--concurrency", "4"),
           env={**POOL, "TASK_WORKER_HEARTBEAT_S": "1", "TASK_WORKER_STALE_MINUTES": "1"},
           config="`--concurrency 4`, `TASK_WORKER_HEARTBEAT_S=1`, "
                  "`TASK_WORKER_STALE_MINUTES=1` (the least each takes: whole seconds and "
                  "minutes), Django's connection pool (its README)"),
    System("pgqueuer", "PgQueuer 1.6", "pgqueuer", "pgqueuer",
           config="`pgqueuer.run()` at its defaults (`batch_size=10`, no concurrency limit, "
                  "psycopg driver)"),
    System("pgqueuer-relaxed", "PgQueuer 1.6, `synchronous_commit=off`", "pgqueuer",
           "pgqueuer", relaxed=True, config="its defaults, every connection "
                                            "`synchronous_commit=off` (as delayq's relaxed pool)"),
    System("procrastinate", "Procrastinate 3.10", "procrastinate", "procrastinate",
           config="`run_worker_async(concurrency=4)`, its defaults otherwise (scheduled jobs "
                  "found by `fetch_job_polling_interval` 5 s)"),
    System("procrastinate-relaxed", "Procrastinate 3.10, `synchronous_commit=off`",
           "procrastinate", "procrastinate", relaxed=True,
           config="as above, every connection `synchronous_commit=off`"),
    System("core-delayq", "delayq's queue core", "core", "delayq",
           config="`DelayedQueue` driven directly: one producer thread offering batches every "
                  "20 ms, two consumer threads polling up to 100 rows and acking as the "
                  "transport does"),
    System("spark-delayq", "Spark `schedule_tasks`", "spark", "delayq",
           config="local[2], 8 partitions, its run ledger"),
    System("copy", "one process COPYing the same rows", "copy", "copy", limit=True,
           config="binary COPY from one Python process, rows built untimed"),
)
BY_NAME = {s.name: s for s in SYSTEMS}


def get(name: str) -> System:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown system {name!r}; known: {', '.join(BY_NAME)}") from None


def app_env(s: System, url: str | None, queue: str,
            options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The variables the system's app reads (apps/*.py), ``options`` over the row's own."""
    opts = json.dumps({**s.options, **(options or {})})
    own = f"{url}{'&' if '?' in url else '?'}{RELAXED}" if url and s.relaxed else url or ""
    env = {"BENCH_QUEUE": queue, "BENCH_OPTIONS": opts, "BENCH_URL": own, **s.env}
    if s.framework == "celery":
        broker = {"delayq": "delayq+" + (url or ""), "redis": REDIS_BROKER_URL,
                  "rabbitmq": AMQP_URL, "memory": "memory://"}[s.broker]
        env |= {"BENCH_BROKER_URL": broker, "BENCH_TRANSPORT_OPTIONS": opts}
    elif s.framework == "dramatiq":
        env |= {"BENCH_BROKER": s.broker, "BENCH_URL": {
            "redis": REDIS_BROKER_URL, "rabbitmq": AMQP_URL[:-1] + "%2F"}.get(s.broker, own)}
    elif s.framework == "django":
        env |= {"DJANGO_SETTINGS_MODULE": "djapp.settings", "BENCH_DB_URL": url or "",
                "BENCH_DJANGO_BACKEND": s.broker}
    return env


def worker_command(s: System, queue: str, layout: tuple[int, int] | None
                   ) -> tuple[list[str], str | None, int]:
    """The worker's command line, the line its log shows once ready (None: the warm-up
    tells) and how many times (once per process)."""
    py = sys.executable
    procs, conc = layout or s.layout or LAYOUTS.get(s.framework, (1, 0))
    if s.framework == "celery":
        return ([py, "-m", "celery", "-A", "celery_app", "worker", "-P", "prefork", "-c",
                str(conc), "--loglevel=WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-n", f"{queue}-{uuid.uuid4().hex[:4]}@%h", "-Q", queue],
                CELERY_READY, 1)
    if s.framework == "dramatiq":
        return [py, "-m", "dramatiq", "dramatiq_app", "-p", str(procs), "-t", str(conc),
                "--queues", queue], "ready for action", procs
    if s.framework == "django":
        return [py, "-m", "django", *s.worker], None, 1
    if s.framework == "pgqueuer":
        return [py, "-c", "import pgqueuer_app; pgqueuer_app.work()"], None, 1
    if s.framework == "procrastinate":
        return [py, "-c", f"import procrastinate_app; procrastinate_app.work({conc})"], None, 1
    raise ValueError(f"{s.name} has no worker")


def producer_command(s: System, job: Mapping[str, Any]) -> list[str]:
    module = {"celery": "celery_app", "dramatiq": "dramatiq_app", "pgqueuer": "pgqueuer_app",
              "procrastinate": "procrastinate_app"}.get(s.framework)
    code = (f"import {module}; {module}.produce_main()" if module else
            "import django; django.setup(); from djapp import tasks; tasks.produce_main()")
    return [sys.executable, "-c", code, json.dumps(job)]


def install_commands(s: System) -> list[list[str]]:
    """What makes the system's schema in its fresh database (``{url}``: its URL; delayq's
    Celery and Dramatiq front ends make their own on first use)."""
    py = sys.executable
    if s.framework in ("pgqueuer", "procrastinate"):
        return [[py, "-c", f"import {s.framework}_app; {s.framework}_app.install()"]]
    if s.framework == "django":
        migrate = [[py, "-m", "django", "migrate", "--no-input", "-v", "0"]]
        return migrate + ([[py, "-m", "delayq_transport", "-d", "{url}", "migrate"]]
                          if s.broker == "delayq" else [])
    if s.broker == "postgres":
        return [["dramatiq-postgres", "--dsn", "{url}", "init"]]
    return []
