"""The failover drill: a primary killed under load, its standby promoted, everything counted.

Used by ``test_failover.py``, which asserts on it. One drill:

1. a primary and its streaming standby (``pg_basebackup -R``; synchronous replication or not),
   a queue database on them, and a results database on the shared server, which never dies;
2. a real ``celery worker`` and a real ``celery beat -S delayq_beat.Scheduler`` (a tick every
   second), both on the libpq multi-host URL ``primary,standby`` with
   ``target_session_attrs=read-write``, and a producer thread in this process publishing
   through the same URL, each task under an id of its own;
3. ``kill -9`` of the primary's postmaster between two ticks, ``pg_ctl promote`` of the
   standby ``outage_s`` later, publishing all along;
4. the queue drained on the new primary, then: every publish ``apply_async`` returned for
   (acknowledged) looked up among the executions, every tick's task id counted.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from delayq_transport import Database, migrate

from .clusters import Cluster, replica_pair, wait_for
from .services import RESULTS_DDL, Service, beat_args, process_env, python_module, worker_args

TICK = {"tick": {"task": "topology.note", "schedule": 1.0, "args": ["tick"]}}
TICK_ARG = json.dumps("tick")
#: The producer's tasks go last (Redis semantics: 0 first; ticks have 0), so a worker behind
#: a fast producer still runs each tick on time and the kill can fall between two ticks.
PRODUCER_PRIORITY = 9
QUEUE_DB = "queue"
#: Durability is what the drill is about: the primary and the standby flush their WAL for real
#: (the other topology clusters run without fsync). Off, a commit's WAL reached the standby
#: sooner than on any real disk, and the defaults lost less than they do.
DURABLE_SETTINGS = {"fsync": "on", "full_page_writes": "on"}
#: Ticks due or leased on a server; the producer's rows (other rows are Celery's own: events,
#: remote control). Row keys are task ids for Celery tasks: the producer's are ``p-<n>``.
_IN_FLIGHT_TICKS = """SELECT count(*) FROM delayed_queue WHERE "pKey" LIKE 'tick/%%'
    AND ("scheduledAt" <= (extract(epoch FROM now()) * 1000)::bigint OR "lockUuid" IS NOT NULL)"""
_PRODUCER_ROWS = """SELECT count(*) FROM delayed_queue WHERE "pKey" LIKE 'p-%%'"""


@dataclass
class DrillConfig:
    synchronous: bool = True  #: the standby is in ``synchronous_standby_names``
    durable: bool = True  #: ``durable_publish`` and ``durable_acks``
    rate_per_s: float = 100.0  #: producer's publishes per second (paced, one thread)
    warmup_executions: int = 100  #: tasks run before the kill
    outage_s: float = 1.0  #: kill -> promote
    after_s: float = 3.0  #: publishing after the promotion
    drain_timeout_s: float = 60.0
    burst_s: float = 0.4  #: unpaced publishing right before the kill (see _kill)
    #: Kill between two ticks, with none in flight (see _kill); off, right after the warm-up.
    kill_between_ticks: bool = True


@dataclass
class DrillResult:
    acknowledged: list[str] = field(default_factory=list)
    failed_publishes: int = 0
    acknowledged_after_promotion: int = 0
    lost: list[str] = field(default_factory=list)  #: acknowledged, never executed
    duplicated: list[str] = field(default_factory=list)  #: producer tasks run twice or more
    tick_ids: list[str] = field(default_factory=list)  #: one per tick execution
    ticks_after_promotion: int = 0
    recovery_s: float | None = None  #: promotion -> first task run after it
    publish_recovery_s: float | None = None  #: promotion -> first publish acknowledged after
    worker_pids: set[int] = field(default_factory=set)
    worker_pid: int = 0
    worker_alive: bool = False
    #: Publishes acknowledged per second in the burst before the kill (what a loss is
    #: measured against: lost / this = the window of publishes lost, in seconds).
    burst_rate_per_s: float = 0.0

    @property
    def duplicate_ticks(self) -> list[str]:
        return sorted({t for t in self.tick_ids if self.tick_ids.count(t) > 1})


class Producer(threading.Thread):
    """Publishes ``topology.note`` tasks at a steady pace; remembers which returned."""

    def __init__(self, app: Any, rate_per_s: float) -> None:
        super().__init__(name="drill-producer", daemon=True)
        self.app = app
        self.rate_interval_s = 1.0 / rate_per_s
        #: Seconds between publishes: 0 during the burst before the kill.
        self.interval_s = self.rate_interval_s
        self.acked: list[tuple[str, float]] = []
        self.failed: list[tuple[str, float, str]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        next_at = time.monotonic()
        while not self.halt.is_set():
            task_id = f"p-{n}"
            n += 1
            try:
                self.app.send_task("topology.note", args=[task_id], task_id=task_id,
                                   priority=PRODUCER_PRIORITY)
                self.acked.append((task_id, time.time()))
            except Exception as exc:  # the outage: counted, and the next one is tried
                self.failed.append((task_id, time.time(), repr(exc)))
            next_at = max(next_at + self.interval_s, time.monotonic())
            self.halt.wait(next_at - time.monotonic())


def broker_url(primary: Cluster, standby: Cluster, password: str = "") -> str:
    user = f"postgres:{password}" if password else "postgres"
    return (f"delayq+postgresql://{user}@127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
            f"/{QUEUE_DB}?target_session_attrs=read-write")


def run_drill(root: Path, results_url: str, config: DrillConfig, log_dir: Path,
              producer_app: Any) -> DrillResult:
    """One drill (see the module docstring). ``producer_app`` is a Celery app the caller made
    and closes; its broker URL and transport options are set here."""
    with psycopg.connect(results_url, autocommit=True) as conn:
        conn.execute(RESULTS_DDL)
        conn.execute("TRUNCATE executions")
    with replica_pair(root, config.synchronous, DURABLE_SETTINGS) as (primary, standby):
        primary.execute(f"CREATE DATABASE {QUEUE_DB}")
        with Database(primary.url(QUEUE_DB)) as db:
            migrate(db, "delayed_queue")
        return _drill(primary, standby, results_url, config, log_dir, producer_app)


def _drill(primary: Cluster, standby: Cluster, results_url: str, config: DrillConfig,
           log_dir: Path, producer_app: Any) -> DrillResult:
    url = broker_url(primary, standby)
    options = {"durable_publish": config.durable, "durable_acks": config.durable,
               "polling_interval": 1, "acquire_timeout": 10}
    env = process_env(DELAYQ_BROKER_URL=url, DELAYQ_RESULTS_URL=results_url,
                      DELAYQ_TRANSPORT_OPTIONS=json.dumps(options),
                      BEAT_SCHEDULE=json.dumps(TICK), BEAT_REFRESH="2", BEAT_HORIZON="30")
    worker = Service(python_module(*worker_args("drill")), env, log_dir / "worker.log")
    beat = Service(python_module(*beat_args()), env, log_dir / "beat.log")
    producer_app.conf.update(broker_url=url, broker_transport_options=options)
    producer = Producer(producer_app, config.rate_per_s)
    result = DrillResult(worker_pid=worker.proc.pid)
    try:
        worker.wait_for_log("ready.")
        beat.wait_for_log("delayq beat: refreshed")
        producer.start()
        wait_for(lambda: _ran(results_url) >= config.warmup_executions
                 and _ran(results_url, ticks=True) >= 1, "tasks and a tick to run", timeout=60)
        _kill(primary, standby, producer, config)
        killed_at = time.time()
        producer.interval_s = producer.rate_interval_s
        result.burst_rate_per_s = sum(
            1 for _, t in producer.acked if t > killed_at - config.burst_s) / config.burst_s
        time.sleep(config.outage_s)  # the outage itself is what is measured: not a wait on an event
        standby.promote()
        promoted_at = time.time()
        deadline = time.monotonic() + config.after_s
        producer.halt.wait(max(deadline - time.monotonic(), 0))
        producer.halt.set()
        producer.join(timeout=60)
        _drain(standby, results_url, config.drain_timeout_s)
        result.worker_alive = worker.alive()
    finally:
        producer.halt.set()
        for service in (worker, beat):
            service.stop()
    return _count(result, producer, results_url, promoted_at)


def _ran(results_url: str, ticks: bool = False) -> int:
    op = "=" if ticks else "<>"
    with psycopg.connect(results_url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM executions WHERE arg {op} %s",
                           (TICK_ARG,)).fetchone()
    return int(row[0]) if row else 0


def _kill(primary: Cluster, standby: Cluster, producer: Producer, config: DrillConfig) -> None:
    """Burst, then ``kill -9`` the primary.

    The last ``burst_s`` before the kill the producer publishes as fast as it can (~700-900
    publishes/s from one thread here): how much an unflushed or unshipped commit loses grows
    with the rate (at 80-300/s the defaults lost nothing in four drills, at ~800/s 61-121),
    and a short burst measures that without a backlog the worker would take long to drain.

    With ``kill_between_ticks`` the burst starts 0.1-0.3 s after a whole second, when the
    standby holds no tick that is due or leased (every tick run so far has its ack there),
    and the kill comes before the next tick: a tick run but not yet acknowledged when the
    server dies comes back after its lease, as any unacknowledged message does
    (at-least-once), which is not what this drill measures about beat.
    """
    def quiet() -> bool:
        return standby.execute(_IN_FLIGHT_TICKS, QUEUE_DB)[0][0] == 0

    if config.kill_between_ticks:
        wait_for(lambda: 0.1 <= time.time() % 1 <= 0.3 and quiet(),
                 "a moment between ticks with no tick in flight on the standby",
                 timeout=30, interval=0.01)
    producer.interval_s = 0.0
    burst_end = time.monotonic() + config.burst_s
    wait_for(lambda: time.monotonic() >= burst_end, "the burst", timeout=config.burst_s + 1,
             interval=0.005)
    if config.kill_between_ticks:
        assert quiet(), "a tick became due during the burst: burst_s must stay under 0.6 s"
    primary.kill()


def _drain(server: Cluster, results_url: str, timeout_s: float) -> None:
    """Wait until the new primary holds no producer row and the executions stop growing."""
    seen = [-1]

    def drained() -> bool:
        if server.execute(_PRODUCER_ROWS, QUEUE_DB)[0][0] != 0:
            return False
        count = _ran(results_url)
        settled, seen[0] = count == seen[0], count
        return settled

    wait_for(drained, "the queue to drain on the promoted standby", timeout=timeout_s,
             interval=0.5)


def _count(result: DrillResult, producer: Producer, results_url: str,
           promoted_at: float) -> DrillResult:
    with psycopg.connect(results_url, autocommit=True) as conn:
        rows = conn.execute("SELECT task_id, arg, pid, extract(epoch FROM ran_at)::float8"
                            " FROM executions ORDER BY id").fetchall()
    runs: dict[str, int] = {}
    for task_id, arg, pid, ran_at in rows:
        result.worker_pids.add(int(pid))
        if arg == TICK_ARG:
            result.tick_ids.append(task_id)
            result.ticks_after_promotion += ran_at > promoted_at
        else:
            runs[task_id] = runs.get(task_id, 0) + 1
        if ran_at > promoted_at and (result.recovery_s is None
                                     or ran_at - promoted_at < result.recovery_s):
            result.recovery_s = ran_at - promoted_at
    result.acknowledged = [task_id for task_id, _ in producer.acked]
    result.failed_publishes = len(producer.failed)
    after = [t for _, t in producer.acked if t > promoted_at]
    result.acknowledged_after_promotion = len(after)
    result.publish_recovery_s = min(after) - promoted_at if after else None
    result.lost = [t for t in result.acknowledged if t not in runs]
    result.duplicated = sorted(t for t, n in runs.items() if n > 1)
    return result
