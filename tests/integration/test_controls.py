"""Fleet-wide control in the database (core/queue/controls.py, docs/how-to/limits.md): paused
queues, concurrency and rate limits, per queue and per key, on a real PostgreSQL; several
consumers here are separate pools (separate server sessions), as separate workers are. Real
worker processes of each front end: tests/acceptance/test_limits.py, tests/djtasks/test_limits.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from _workers import snapshot, wait_until

from delayq_transport import DelayedQueue, InvalidInput, Offer
from delayq_transport.browse.controls import QueueControls
from delayq_transport.formats import queues

T0 = datetime(2031, 1, 1, tzinfo=UTC)


class Clock:
    """An injected clock the test moves (the claim reads it, not the database's)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += timedelta(milliseconds=ms)


def consumer(url: str, **options: object) -> DelayedQueue:
    return DelayedQueue(url, kind="mail", naming=queues, pool_max_size=1, **options)  # type: ignore[arg-type]


def celery_payload(key: str | None = None) -> bytes:
    headers = {} if key is None else {"delayq_limit_key": key}
    return json.dumps({"body": "", "headers": headers}).encode()


@pytest.fixture
def mail(database_url: str) -> Iterator[DelayedQueue]:
    with consumer(database_url) as queue:
        yield queue


def test_a_paused_queue_claims_nothing_and_keeps_its_rows_until_resumed(
        database_url: str, mail: DelayedQueue) -> None:
    mail.offer_batch([Offer(f"due{i}", celery_payload()) for i in range(3)]
                     + [Offer("later", celery_payload(), T0)])
    other = mail.with_kind("other")
    other.offer("o", b"x")
    mail.pause("mail")
    before = [r for r in snapshot(database_url) if r[2] == "mail"]
    assert mail.poll(10) == ([], None)  # no due time either: resuming wakes the consumers
    assert [e.key for e in other.poll(10)[0]] == ["o"]  # other queues go on
    assert [r for r in snapshot(database_url) if r[2] == "mail"] == before  # untouched
    with consumer(database_url) as restarted:  # the state is the database's
        assert restarted.poll(10)[0] == []
        restarted.resume("mail")
        assert sorted(e.key for e in restarted.poll(10)[0]) == ["due0", "due1", "due2"]
    assert [(c.control.name, c.control.paused) for c in mail.controls()] == []


def test_a_queue_name_covers_every_priority_kind_of_its_front_end(mail: DelayedQueue) -> None:
    high, low = "mail", "mail\x06\x163"
    mail.offer("a", b"{}")
    mail.with_kind(low).offer("b", b"{}")
    mail.with_kind("dramatiq:mail:p1").offer("c", b"{}")
    mail.pause("mail")
    assert mail.poll(10, [high, low, "dramatiq:mail:p1"])[0] == []
    mail.limit("dramatiq:mail", concurrency=5)  # the qualified name governs Dramatiq's kinds
    assert [e.key for e in mail.poll(10, [high, low, "dramatiq:mail:p1"])[0]] == ["c"]


def test_a_concurrency_limit_holds_across_consumers_and_frees_with_acks_and_leases(
        database_url: str, mail: DelayedQueue) -> None:
    mail.offer_batch([Offer(f"k{i}", celery_payload()) for i in range(10)])
    mail.limit("mail", concurrency=3)
    with consumer(database_url, acquire_timeout=0.5) as a, consumer(database_url) as b:
        taken = a.poll(2)[0]
        assert len(taken) == 2
        more, retry_at = b.poll(10)
        assert len(more) == 1 and retry_at is not None  # held back: look again soon
        assert b.poll(10)[0] == []
        b.ack(more[0])
        assert len(b.poll(10)[0]) == 1
        # a's two leases lapse (a killed worker): their slots come back with them
        got: list[object] = []
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while len(got) < 2 and datetime.now(UTC) < deadline:
            got += b.poll(10)[0]
        assert len(got) == 2
    [use] = mail.controls()
    assert use.in_use == 3 and use.control.concurrency == 3


def test_a_key_limit_lets_other_keys_through(mail: DelayedQueue) -> None:
    mail.offer_batch([Offer(f"a{i}", celery_payload("acme")) for i in range(5)]
                     + [Offer(f"b{i}", celery_payload("bolt")) for i in range(2)]
                     + [Offer("n", celery_payload())])
    mail.limit("mail", key_concurrency=2)
    keys = sorted(e.key for e in mail.poll(100)[0])
    assert keys == ["a0", "a1", "b0", "b1", "n"]  # no key: only the queue's limits apply
    before_ms = int(mail.now().timestamp() * 1000)
    envs, retry_at = mail.poll(100)
    assert envs == [] and retry_at is not None and retry_at >= before_ms  # later, not a spin
    [use] = mail.controls()
    assert (use.in_use, use.keys_in_use) == (5, 2)


def drain_at_rate(queue: DelayedQueue, clock: Clock, step_ms: int, steps: int) -> list[int]:
    """Poll every ``step_ms`` of the injected clock; how many rows each poll took."""
    taken = []
    for _ in range(steps):
        envs, _ = queue.poll(100)
        queue.ack_many(envs)
        taken.append(len(envs))
        clock.advance(step_ms)
    return taken


def test_a_rate_limit_is_a_token_bucket_never_early_never_dropped(database_url: str) -> None:
    clock = Clock()
    with consumer(database_url, clock=clock) as queue:
        queue.offer_batch([Offer(f"k{i}", celery_payload(), T0) for i in range(300)])
        queue.limit("mail", rate="50/s")  # a bucket of 100 ms of the rate: 5 tokens
        clock.advance(-1)
        assert queue.poll(100)[0] == []  # never early: not due yet
        clock.advance(1)
        taken = drain_at_rate(queue, clock, 10, 400)  # 4 s of polls every 10 ms
        assert taken[0] == 5  # the full bucket, then half a token per 10 ms
        assert sum(taken) == 5 + 199
        assert max(sum(taken[i:i + 100]) for i in range(0, 300)) <= 50 + 5  # any second
        rest = drain_at_rate(queue, clock, 10, 300)
        assert sum(taken) + sum(rest) == 300  # nothing dropped
        # a held-back claim says when the next token comes
        queue.offer("z", celery_payload(), clock.now)
        queue.limit("mail", rate="1/m")
        assert len(queue.poll(10)[0]) == 1
        queue.offer("y", celery_payload(), clock.now)
        envs, retry_at = queue.poll(10)
        assert envs == [] and retry_at == int(clock.now.timestamp() * 1000) + 60_000


def test_a_key_rate_limits_each_key_alone(database_url: str) -> None:
    clock = Clock()
    with consumer(database_url, clock=clock) as queue:
        queue.offer_batch([Offer(f"a{i}", celery_payload("acme"), T0) for i in range(20)]
                          + [Offer(f"b{i}", celery_payload("bolt"), T0) for i in range(20)])
        queue.limit("mail", key_rate="10/s")  # one token per key (100 ms of 10/s)
        taken = [e.key[0] for e in queue.poll(100)[0]]
        assert sorted(taken) == ["a", "b"]
        clock.advance(50)
        assert queue.poll(100)[0] == []
        clock.advance(50)
        assert sorted(e.key[0] for e in queue.poll(100)[0]) == ["a", "b"]


def test_bad_input_is_refused_naming_it_and_changes_nothing(mail: DelayedQueue) -> None:
    mail.offer("k", celery_payload())
    mail.limit("mail", concurrency=2, rate="5/s")
    controls = QueueControls(mail)
    cases = [
        (lambda: controls.limit("mail", concurrency=0), "concurrency limit of 'mail'"),
        (lambda: controls.limit("mail", key_concurrency=-1), "key concurrency limit of 'mail'"),
        (lambda: controls.limit("mail", rate="fast"), "rate of 'mail' 'fast' cannot be parsed"),
        (lambda: controls.limit("mail", key_rate="0/s"), "key rate of 'mail' '0/s'"),
        (lambda: controls.pause("nosuch"), "unknown queue 'nosuch'"),
        (lambda: controls.limit("", concurrency=1), "unknown queue ''"),
    ]
    for call, text in cases:
        with pytest.raises(InvalidInput, match=text.replace("(", r"\(")):
            call()
    [use] = mail.controls()
    assert (use.control.concurrency, use.control.rate, use.control.paused) == (2, (5, 1000), False)


def scans_of(url: str) -> int:
    """Scans of the control table so far, as the statistics show them."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
                           "WHERE relname = 'delayed_queue__controls'").fetchone()
    assert row is not None
    return int(row[0])


def scans_by_polls(url: str, polls: int) -> int:
    """Scans of the control table by one consumer that polls ``polls`` times, counted once
    its server session ended (a session reports its statistics when it ends)."""
    before = scans_of(url)
    with consumer(url) as queue:
        for _ in range(polls):
            queue.ack_many(queue.poll(2)[0])
    return wait_until(lambda: scans_of(url) - before, what="the session's statistics")


def test_an_uncontrolled_queue_reads_the_controls_once_then_claims_as_before(
        database_url: str) -> None:
    """Free when unused: beside a controlled queue, polls of another queue send the plain
    claim alone; the controls are read once (and again only when a change is heard)."""
    with consumer(database_url) as queue:
        queue.limit("other", concurrency=1)
        queue.offer_batch([Offer(f"k{i}", b"{}") for i in range(100)])
    wait_until(lambda: scans_of(database_url), what="the statistics of the set-up")
    assert scans_by_polls(database_url, 2) == 1
    assert scans_by_polls(database_url, 40) == 1


def test_the_page_shows_and_changes_controls_under_csrf(mail: DelayedQueue) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from delayq_transport.web.app import create_app
    from delayq_transport.web.security import WebConfig

    mail.offer("k", celery_payload())
    c = TestClient(create_app(mail, WebConfig()), base_url="http://127.0.0.1:8377")
    token = c.get("/api/csrf").json()["csrf_token"]
    assert c.post("/queues/pause", data={"name": "mail"}).status_code == 403  # no token
    r = c.post("/queues/pause", data={"name": "mail", "csrf_token": token},
               follow_redirects=False)
    assert r.status_code == 303 and mail.controls()[0].control.paused
    r = c.post("/api/queues/limit", json={"name": "mail", "concurrency": "3", "rate": "50/s"},
               headers={"X-CSRF-Token": token})
    assert r.status_code == 200, r.text
    [shown] = c.get("/api/queues").json()["controls"]
    assert (shown["paused"], shown["concurrency"], shown["rate"]) == (True, 3, "50/s")
    page = c.get("/queues").text
    assert "mail" in page and "50/s" in page and "resume" in page
    bad = c.post("/api/queues/limit", json={"name": "mail", "rate": "fast"},
                 headers={"X-CSRF-Token": token})
    assert bad.status_code == 400 and "rate of 'mail' 'fast'" in bad.json()["error"]
    unknown = c.post("/api/queues/pause", json={"name": "nosuch"},
                     headers={"X-CSRF-Token": token})
    assert unknown.status_code == 400 and "unknown queue 'nosuch'" in unknown.json()["error"]
    read_only = TestClient(create_app(mail, WebConfig(read_only=True)),
                           base_url="http://127.0.0.1:8377")
    assert read_only.post("/queues/resume", data={"name": "mail", "csrf_token": token}
                          ).status_code == 403
    assert mail.controls()[0].control.paused  # nothing the refused calls asked changed


def test_status_and_metrics_show_each_control(database_url: str, mail: DelayedQueue) -> None:
    import subprocess
    import sys

    from delayq_transport.metrics import render

    mail.offer("k", celery_payload())
    mail.limit("mail", concurrency=3, rate="50/s")
    mail.pause("mail")
    done = subprocess.run([sys.executable, "-m", "delayq_transport", "-d", database_url,
                           "status", "--json"], capture_output=True, text=True, timeout=60)
    [shown] = json.loads(done.stdout)["controls"]
    assert (shown["queue"], shown["paused"], shown["concurrency"], shown["in_use"],
            shown["rate"]) == ("mail", True, 3, 0, "50/s")
    scrape = render(mail).decode()
    for line in ('delayq_queue_paused{queue="mail",table="delayed_queue"} 1.0',
                 'delayq_queue_concurrency_limit{queue="mail",table="delayed_queue"} 3.0',
                 'delayq_queue_in_use{queue="mail",table="delayed_queue"} 0.0',
                 'delayq_queue_rate_limit_per_second{queue="mail",table="delayed_queue"} 50.0'):
        assert line in scrape


def test_the_cli_refuses_bad_input_naming_it(database_url: str, mail: DelayedQueue) -> None:
    import subprocess
    import sys

    mail.offer("k", celery_payload())

    def delayq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "delayq_transport", "-d", database_url,
                               "queues", *args], capture_output=True, text=True, timeout=60)

    for args, text in ((("limit", "mail", "--concurrency", "0"), "concurrency limit of 'mail'"),
                       (("limit", "mail", "--rate", "50/x"), "rate of 'mail' '50/x'"),
                       (("limit", "mail", "--concurrency", "three"), "'three'"),
                       (("pause", "nosuch"), "unknown queue 'nosuch'")):
        done = delayq(*args)
        assert done.returncode != 0 and text in done.stderr, (args, done.stderr)
    assert mail.controls() == []
    assert "concurrency 2, rate 5/s" in delayq("limit", "mail", "--concurrency", "2",
                                               "--rate", "5/s").stdout
    assert "no limits" in delayq("limit", "mail", "--concurrency", "none", "--rate",
                                 "none").stdout
    assert mail.controls() == []
