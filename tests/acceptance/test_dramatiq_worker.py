"""Real ``dramatiq`` CLI workers (processes and threads) on the delayq broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq  # noqa: F401  (the dev extra installs it: missing, collection fails here)
import psycopg
import pytest

HERE = Path(__file__).parent
REDIS_DB = "12"
#: Each test flushes that Redis database: one pytest-xdist process runs them one after another
#: (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("redis-12")
Runs = list[tuple[str, str, int, str, int, str, int]]
RUNS_DDL = """CREATE TABLE IF NOT EXISTS dramatiq_runs (
    id BIGSERIAL PRIMARY KEY, actor TEXT, tag TEXT, pid INT, message_id TEXT, retries INT,
    phase TEXT DEFAULT 'done', ran_at_ms BIGINT DEFAULT (extract(epoch FROM clock_timestamp())
    * 1000)::bigint)"""



class DramatiqWorker:
    """``dramatiq dramatiq_app``; its output goes to a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "dramatiq_app", *args], cwd=HERE, env=env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30) -> None:
        wait_for(lambda: "is ready for action" in self.log() or self.proc.poll() is not None,
                 timeout, "worker start")
        assert self.proc.poll() is None, self.log()[-3000:]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self, graceful: bool = True) -> None:
        try:
            self.kill(signal.SIGTERM if graceful else signal.SIGKILL)
        except subprocess.TimeoutExpired:
            self.kill()
        self._log.close()


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def app_env(database_url: str) -> Iterator[dict[str, str]]:
    import redis

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(RUNS_DDL)
    env = dict(os.environ, DELAYQ_DATABASE_URL=database_url,
               DELAYQ_REDIS_RESULTS=f"redis://127.0.0.1:6379/{REDIS_DB}",
               PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent.parent),
                                           os.environ.get("PYTHONPATH", "")]))
    old = {k: os.environ.get(k) for k in ("DELAYQ_DATABASE_URL", "DELAYQ_REDIS_RESULTS")}
    os.environ.update({k: env[k] for k in old})
    client = redis.Redis.from_url(env["DELAYQ_REDIS_RESULTS"])
    client.flushdb()
    sys.path.insert(0, str(HERE))
    try:
        yield env
    finally:
        sys.path.remove(str(HERE))
        app = sys.modules.pop("dramatiq_app", None)
        if app is not None:
            app.broker.close()
    client.flushdb()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def start_worker(app_env: dict[str, str],
                 tmp_path: Path) -> Iterator[Callable[..., DramatiqWorker]]:
    workers: list[DramatiqWorker] = []

    def start(*args: str, env: dict[str, str] | None = None) -> DramatiqWorker:
        w = DramatiqWorker(list(args), dict(app_env, **(env or {})),
                           tmp_path / f"worker-{len(workers)}.log")
        workers.append(w)
        w.wait_ready()
        return w

    yield start
    for w in workers:
        w.stop(graceful=False)  # the database is dropped anyway; SIGTERM costs ~5 s each


@pytest.fixture
def app(app_env: dict[str, str]) -> object:
    """The app module imported here too (a fresh broker on this test's database), to send."""
    import importlib

    return importlib.import_module("dramatiq_app")


def runs(url: str, actor: str | None = None) -> Runs:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT actor, tag, pid, message_id, retries, phase, ran_at_ms FROM dramatiq_runs "
            "WHERE %(a)s::text IS NULL OR actor = %(a)s ORDER BY id", {"a": actor}).fetchall()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def _row_count(url: str, sql: str, *params: object) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.slow
def test_worker_runs_queues_delays_retries_limits_callbacks_and_compositions(
        app: object, start_worker: Callable[..., DramatiqWorker], database_url: str) -> None:
    a = app  # the module: actors and broker
    broker = a.broker  # type: ignore[attr-defined]
    start_worker("-p", "2", "-t", "2")
    for i in range(40):
        a.note.send(f"a{i}")  # type: ignore[attr-defined]
        a.note_beta.send(f"b{i}")  # type: ignore[attr-defined]
    # Each ETA is the sent message's own (options["eta"], ms), not a clock read around the send.
    delayed_eta = a.note.send_with_options(  # type: ignore[attr-defined]
        args=("delayed",), delay=1500).options["eta"]
    far_etas = {days: a.note.send_with_options(  # type: ignore[attr-defined]
        args=(f"d{days}",), delay=int(timedelta(days=days).total_seconds() * 1000)
    ).options["eta"] for days in (30, 90)}  # far beyond Redis' 7-day limit: stored, not run
    a.flaky.send("twice", 2)  # type: ignore[attr-defined]
    a.too_slow.send("limit")  # type: ignore[attr-defined]
    a.note.send_with_options(args=("too-old",), delay=800, max_age=100)  # type: ignore[attr-defined]
    a.add.send_with_options(args=(2, 3), on_success=a.on_ok)  # type: ignore[attr-defined]
    pipe = dramatiq.pipeline([a.add.message(1, 2), a.add.message(10)]).run()  # type: ignore[attr-defined]
    grp = dramatiq.group([a.add.message(i, i) for i in range(5)]).run()  # type: ignore[attr-defined]

    assert pipe.get_result(block=True, timeout=20_000) == 13
    assert list(grp.get_results(block=True, timeout=20_000)) == [0, 2, 4, 6, 8]
    broker.join("beta", timeout=20_000)
    wait_for(lambda: len(runs(database_url, "note")) == 41, 20, "41 notes")
    wait_for(lambda: len(runs(database_url, "flaky")) == 3, 20, "3 flaky runs")
    wait_for(lambda: len(runs(database_url, "on_ok")) == 1, 20, "the on_success callback")

    notes = runs(database_url, "note")
    assert sorted(r[1] for r in notes) == sorted([f"a{i}" for i in range(40)] + ["delayed"])
    delayed = next(r for r in notes if r[1] == "delayed")
    assert delayed[6] >= delayed_eta, delayed[6] - delayed_eta  # never early
    assert len(runs(database_url, "note_beta")) == 40
    flaky = runs(database_url, "flaky")
    assert [r[4] for r in flaky] == [0, 1, 2]  # Dramatiq's Retries, with its backoff:
    assert all(b[6] - a_[6] >= 100 for a_, b in zip(flaky, flaky[1:], strict=False))
    assert runs(database_url, "on_ok")[0][1] == "2"
    # Long delays wait in the table as rows due at their eta.
    for eta in far_etas.values():
        assert _row_count(
            database_url, 'SELECT count(*) FROM delayed_queue WHERE "pKind" = %s AND '
            '"scheduledAt" = %s AND "lockUuid" IS NULL', "dramatiq:alpha", eta) == 1
    # TimeLimit and AgeLimit failures are dead letters, kept in the table under .XQ.
    wait_for(lambda: len(broker.dead_letters_of("default")) == 1, 20, "time-limit dead letter")
    wait_for(lambda: len(broker.dead_letters_of("alpha")) == 1, 20, "age-limit dead letter")
    assert broker.dead_letters_of("default")[0].actor_name == "too_slow"
    assert broker.dead_letters_of("alpha")[0].args == ("too-old",)
    assert [r[5] for r in runs(database_url, "too_slow")] == ["start"]
    # flush drops waiting messages, delayed ones included; flush_all the dead letters too.
    broker.flush("alpha")
    assert broker.stats("alpha")["messages"] == 0
    broker.flush_all()
    assert broker.dead_letters == []


def test_a_dead_letter_is_listed_then_expired_by_the_worker(
        app: object, start_worker: Callable[..., DramatiqWorker], database_url: str) -> None:
    """The dead-letter policy (formats/deadletters.py) under a real worker: listed beside the
    other front ends' (``delayq tasks dead-letters``), deleted by the worker's expiry when its
    retention (``dead_message_ttl``) ends, nothing else touched."""
    from _dead_letters import bystanders, listed

    left = bystanders(database_url)
    start_worker("--processes", "1", "--threads", "1", env={"DELAYQ_DEAD_TTL_MS": "15000"})
    sent = app.broken.send("x")  # type: ignore[attr-defined]
    [letter] = wait_until(lambda: listed(database_url, "dramatiq"), 30, "a dead letter")
    assert (letter["queue"], letter["actor"], letter["message_id"]) == (
        "default", "broken", sent.message_id)
    assert letter["exception"] == "ValueError: broken x"
    wait_until(lambda: not listed(database_url, "dramatiq"), 90, "the dead letter expired")
    assert left() == [("bystander", "due-now"), ("dramatiq:kept.XQ", "kept-a-day")]


def test_a_worker_waits_for_delayq_migrate_then_consumes(
        app_env: dict[str, str], tmp_path: Path) -> None:
    """Started on a database without delayq's tables, its role unable to create them (a
    deploy where ``delayq migrate`` runs beside the new workers): it waits, saying so every
    few seconds and naming ``delayq migrate``, and consumes once the release step ran
    (docs/how-to/upgrade.md#a-worker-before-delayq-migrate; Celery's:
    tests/acceptance/test_schema_wait.py)."""
    from _pg_roles import before_migrate

    from delayq_transport.dramatiq import DelayqBroker

    waiting = "waiting for its tables: no delayq tables in database"
    with before_migrate() as (owner, role, release):
        worker = DramatiqWorker(["--processes", "1", "--threads", "1"],
                                dict(app_env, DELAYQ_DATABASE_URL=role), tmp_path / "w.log")
        try:
            wait_until(lambda: worker.log().count(waiting) >= 2, 60, "the line, twice")
            line = next(x for x in worker.log().splitlines() if waiting in x)
            assert "run `delayq migrate`" in line and "giving up in" in line
            assert worker.proc.poll() is None
            release()
            with psycopg.connect(owner, autocommit=True) as conn:
                conn.execute(RUNS_DDL)
                conn.execute(f"GRANT ALL ON dramatiq_runs, dramatiq_runs_id_seq TO "
                             f"\"{role.split('//')[1].split('@')[0]}\"")
            worker.wait_ready(60)
            broker = DelayqBroker(url=owner)
            try:
                broker.declare_queue("alpha")
                broker.enqueue(dramatiq.Message(queue_name="alpha", actor_name="note",
                                                args=("after migrate",), kwargs={},
                                                options={}))
                wait_until(lambda: runs(owner, "note"), 30, "the task ran")
            finally:
                broker.close()
        finally:
            worker.stop(graceful=False)


def test_a_waiting_worker_stops_at_once_on_sigterm(
        app_env: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM to the ``dramatiq`` process ends its worker's wait for the tables (exit 0),
    not the 600 s of ``schema_wait``."""
    from _pg_roles import before_migrate

    with before_migrate() as (_, role, _release):
        worker = DramatiqWorker(["--processes", "1", "--threads", "1"],
                                dict(app_env, DELAYQ_DATABASE_URL=role), tmp_path / "w.log")
        try:
            wait_until(lambda: "waiting for its tables" in worker.log(), 60, "the line")
            os.kill(worker.proc.pid, signal.SIGTERM)
            assert worker.proc.wait(timeout=15) == 0, worker.log()[-2000:]
        finally:
            worker.stop(graceful=False)


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """:func:`wait_for` that returns what the condition found."""
    found: list[Any] = []
    wait_for(lambda: bool(found.append(cond()) or found[-1]), timeout, what)
    return found[-1]


@pytest.mark.slow
def test_higher_broker_priority_is_served_first(
        app: object, start_worker: Callable[..., DramatiqWorker], database_url: str) -> None:
    a = app
    for i in range(10):
        a.note.send(f"low{i}")  # type: ignore[attr-defined]
    for i in range(10):
        a.note.send_with_options(args=(f"high{i}",), broker_priority=3)  # type: ignore[attr-defined]
    start_worker("-p", "1", "-t", "1", "--queues", "alpha")
    a.broker.join("alpha", timeout=20_000)  # type: ignore[attr-defined]
    order = [r[1] for r in runs(database_url, "note")]
    assert order == [f"high{i}" for i in range(10)] + [f"low{i}" for i in range(10)]


@pytest.mark.slow
def test_leases_extend_while_the_worker_lives_and_lapse_when_it_is_killed(
        app: object, start_worker: Callable[..., DramatiqWorker], database_url: str) -> None:
    a = app
    lease = {"DELAYQ_LEASE": "1"}
    first = start_worker("-p", "1", "-t", "2", env=lease)
    a.slow.send("long", 2.5)  # type: ignore[attr-defined]  # 2.5 leases long: extended
    wait_for(lambda: len(runs(database_url, "slow")) == 2, 20, "the long task")
    assert [r[5] for r in runs(database_url, "slow")] == ["start", "done"]
    # Acks are deleted in batches (every 20 ms): killed before that, the long task's row is
    # legitimately still leased and comes back too. Let its ack land first.
    wait_for(lambda: _row_count(database_url, "SELECT count(*) FROM delayed_queue") == 0, 10,
             "the long task's ack")

    victim = a.slow.send("victim", 60)  # type: ignore[attr-defined]
    wait_for(lambda: len(runs(database_url, "slow")) == 3, 20, "the victim to start")
    first.kill()  # kill -9 the whole worker: no ack, no release
    # The lease the dead worker last set: nothing extends it any more. The victim's start is
    # not the reference (the lease was set when the row was fetched, a few ms earlier).
    with psycopg.connect(database_url) as conn:
        row = conn.execute('SELECT "scheduledAt" FROM delayed_queue WHERE "lockUuid" IS NOT NULL'
                           ' AND "pKey" LIKE %s', (f"{victim.message_id}.%",)).fetchall()
    assert len(row) == 1, row
    lease_end = row[0][0]
    second = start_worker("-p", "1", "-t", "2", env=lease)
    wait_for(lambda: sum(r[1] == "victim" for r in runs(database_url, "slow")) == 2, 20,
             "the victim to come back")
    starts = [r for r in runs(database_url, "slow") if r[1] == "victim"]
    assert starts[0][2] != starts[1][2]  # another process ran it again
    assert starts[1][6] >= lease_end  # not before the lease ran out
    second.kill()


@pytest.mark.slow
@pytest.mark.parametrize("linger", ["0", "0.005"], ids=["unbuffered", "publish_linger"])
def test_many_producers_and_consumers_lose_and_duplicate_nothing(
        app_env: dict[str, str], start_worker: Callable[..., DramatiqWorker],
        database_url: str, linger: str) -> None:
    """Also with ``publish_linger``: the producers' sends are written in batches by a thread,
    and the last ones by interpreter exit (the producers end without closing the broker)."""
    per_producer, producers = 300, 3
    start_worker("-p", "2", "-t", "4")
    start_worker("-p", "2", "-t", "4")
    code = ("import sys, dramatiq_app as a\n"
            "for j in range(int(sys.argv[2])): a.note.send(f'p{sys.argv[1]}-{j}')\n"
            + ("a.broker.close()\n" if linger == "0" else ""))
    env = dict(app_env, DELAYQ_PUBLISH_LINGER=linger)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(per_producer)],
                              cwd=HERE, env=env) for i in range(producers)]
    assert [p.wait(timeout=120) for p in procs] == [0] * producers
    total = per_producer * producers
    wait_for(lambda: len(runs(database_url, "note")) >= total, 60, f"{total} runs")
    tags = [r[1] for r in runs(database_url, "note")]
    assert len(tags) == total and len(set(tags)) == total
    assert len({r[2] for r in runs(database_url, "note")}) >= 2  # spread over processes


@pytest.mark.slow
def test_periodic_actor_fires_once_per_occurrence_even_with_no_scheduler_up(
        app_env: dict[str, str], start_worker: Callable[..., DramatiqWorker],
        database_url: str) -> None:
    periodic_env = {"DELAYQ_PERIODIC": "1"}
    # Two worker processes with two processes each: four schedulers install the same ticks.
    workers = [start_worker("-p", "2", "-t", "2", "--queues", "ticks", env=periodic_env)
               for _ in range(2)]
    wait_for(lambda: len(runs(database_url, "every_second")) >= 3, 20, "three ticks")
    for w in workers:
        w.kill(signal.SIGTERM)
    down_from = time.time() * 1000
    # Every scheduler is down; a plain worker (no scheduler) still runs installed ticks.
    start_worker("-p", "1", "-t", "2", "--queues", "ticks")
    wait_for(lambda: sum(int(r[1]) > down_from + 1000 for r in runs(database_url, "every_second"))
             >= 2, 20, "ticks while no scheduler runs")
    ticks = [int(r[1]) for r in runs(database_url, "every_second")]
    assert len(ticks) == len(set(ticks)), "an occurrence ran twice"
    assert all(t % 1000 == 0 for t in ticks)  # epoch-aligned occurrences


class SchedulerProcess:
    """``python _dramatiq_scheduler.py``: a PeriodicScheduler that starts refreshing on
    :meth:`go`, so several can be started at one chosen instant."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "_dramatiq_scheduler.py"], cwd=HERE, env=env,
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait_ready(self) -> None:
        wait_for(lambda: "ready" in self.log_path.read_text() or self.proc.poll() is not None,
                 30, "scheduler start")
        assert self.proc.poll() is None, self.log_path.read_text()[-3000:]

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._log.close()


def _installed_until(url: str, entry: str) -> int:
    return _row_count(url, 'SELECT "installedUntil" FROM delayq_schedule_installed '
                           "WHERE \"tableName\" = 'delayed_queue#dramatiq' AND name = %s", entry)


@pytest.mark.slow
def test_periodic_catch_up_after_an_outage_longer_than_the_horizon(
        app_env: dict[str, str], start_worker: Callable[..., DramatiqWorker],
        database_url: str, tmp_path: Path) -> None:
    """Every scheduler down for longer than the horizon (a few seconds here) while a worker
    stays up: the occurrences after the last installed one are never written. Four
    schedulers restarted at the same instant catch the gap up once under ``coalesce`` (its
    newest occurrence, at restart) and not at all under ``skip``; regular ticks resume."""
    from _dramatiq_scheduler import GRACE_S, HORIZON_S, PERIOD_S, POLICIES, entry_name

    period_ms = PERIOD_S * 1000
    start_worker("-p", "1", "-t", "2", "--queues", "catchup")  # no scheduler in it
    schedulers: list[SchedulerProcess] = []

    def start_schedulers(n: int) -> list[SchedulerProcess]:
        started = [SchedulerProcess(app_env, tmp_path / f"scheduler-{len(schedulers) + i}.log")
                   for i in range(n)]
        schedulers.extend(started)
        for s in started:
            s.wait_ready()
        return started

    def ticks(policy: str) -> list[int]:
        return [int(r[1].split(":")[1]) for r in runs(database_url, "catch_up_tick")
                if r[1].startswith(f"{policy}:")]

    def now_ms() -> int:
        return int(time.time() * 1000)

    try:
        for s in start_schedulers(4):
            s.go()
        wait_for(lambda: all(len(ticks(p)) >= 2 for p in POLICIES), 30, "ticks")
        for s in schedulers:
            s.kill()
        last = {p: _installed_until(database_url, entry_name(p)) for p in POLICIES}
        assert len(set(last.values())) == 1 and max(last.values()) <= now_ms() + \
            (HORIZON_S + PERIOD_S) * 1000
        gap_start = last["coalesce"]
        # The outage: past the horizon by two more occurrences, none of them installed.
        restarted = start_schedulers(4)
        wait_for(lambda: now_ms() > gap_start + 2 * period_ms + 1500, 30, "the outage")
        assert [t for p in POLICIES for t in ticks(p) if t > gap_start] == [], \
            "an occurrence after the installed horizon ran before any scheduler was back"
        # Restart where the gap's newest occurrence is more than grace late and the next one
        # is more than min_lead (1 s) ahead, so "one catch-up" and "none" are unambiguous.
        wait_for(lambda: 1000 <= now_ms() % period_ms <= 1400, 10, "the restart instant")
        restart_ms = now_ms()
        for s in restarted:
            s.go()
        newest_missed = restart_ms - restart_ms % period_ms
        assert newest_missed >= gap_start + 2 * period_ms and \
            (restart_ms - newest_missed) / 1000 > GRACE_S

        def resumed() -> bool:  # two regular ticks each: time for a repeat to show up
            return all(sum(t > restart_ms + 1000 for t in ticks(p)) >= 2 for p in POLICIES)

        wait_for(resumed, 30, "ticks after the restart")
    finally:
        for s in schedulers:
            s.kill()
    gap = {p: [t for t in ticks(p) if gap_start < t <= restart_ms + 1000] for p in POLICIES}
    assert gap == {"coalesce": [newest_missed], "skip": []}, gap
    [ran_at] = [r[6] for r in runs(database_url, "catch_up_tick")
                if r[1] == f"coalesce:{newest_missed}"]
    assert ran_at - restart_ms < 10_000, "the catch-up did not run at restart"
    for p in POLICIES:
        assert len(ticks(p)) == len(set(ticks(p))), f"a {p} occurrence ran twice"
