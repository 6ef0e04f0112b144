"""Bad input is refused with a clear delayq error naming the problem, and nothing stored is
lost or altered by the refused call."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _hangup import hang_up_server
from _workers import snapshot
from conftest import create_database, drop_database, url_for

from delayq_transport import (
    CronMessage,
    CronService,
    DatabaseUnavailable,
    DelayedQueue,
    DelayqError,
    InvalidInput,
    Offer,
    SchemaMissing,
)

FUTURE = datetime(2031, 1, 1, tzinfo=UTC)
NAIVE = datetime(2031, 1, 1)
LONG_KEY = "k" * 201
LONG_KIND = "q" * 101


@pytest.fixture(scope="module")
def shared(template_db: str) -> Iterator[tuple[str, DelayedQueue]]:
    """One database for every refused call of this module: since none may change anything,
    sharing it is part of the test (a leak from one case would fail the next)."""
    name = f"delayq_bad_{uuid.uuid4().hex[:12]}"
    url = create_database(name, template=template_db)
    with DelayedQueue(url, kind="test") as queue:
        queue.offer_batch([Offer("waiting", b"w", FUTURE), Offer("held", b"h")])
        queue.with_kind("other").offer("waiting", b"o", FUTURE)
        assert queue.try_poll().key == "held"
        yield url, queue
    drop_database(name)


@pytest.fixture
def seeded(shared: tuple[str, DelayedQueue]) -> Iterator[DelayedQueue]:
    """A queue holding a waiting row, a due row and an in-flight row; the test's call must
    leave all three exactly as they were."""
    url, queue = shared
    before = snapshot(url)
    assert len(before) == 3
    yield queue
    assert snapshot(url) == before, "a refused call changed stored rows"


BAD_CALLS: dict[str, tuple[Callable[[DelayedQueue], Any], str]] = {
    "key over 200 chars": (lambda q: q.offer(LONG_KEY, b"x"), "201 characters, the limit is 200"),
    "empty key": (lambda q: q.offer("", b"x"), "key must be a non-empty str"),
    "key not a str": (lambda q: q.offer(42, b"x"), "key must be a non-empty str"),
    "NUL in key": (lambda q: q.offer("a\x00b", b"x"), "NUL"),
    "str payload": (lambda q: q.offer("waiting", "text"), "payload must be bytes, got str"),
    "None payload": (lambda q: q.offer("waiting", None), "payload must be bytes, got NoneType"),
    "naive datetime": (lambda q: q.offer("waiting", b"x", NAIVE), "timezone-aware"),
    "epoch number as time": (lambda q: q.offer("waiting", b"x", 1700000000), "datetime"),
    "kind over 100 chars": (lambda q: q.with_kind(LONG_KIND), "101 characters, the limit is 100"),
    "kind over 100 in poll": (
        lambda q: q.try_poll_many(5, kinds=["test", LONG_KIND]), "kind is 101 characters"
    ),
    "kind over 100 in purge": (lambda q: q.purge(kinds=[LONG_KIND]), "kind is 101"),
    "NUL in kind": (lambda q: q.count_waiting(kinds=["a\x00"]), "NUL"),
    "long key in get": (lambda q: q.get(LONG_KEY), "201 characters"),
    "NUL key in delete": (lambda q: q.delete("held\x00"), "NUL"),
    "bad key in delete_waiting": (lambda q: q.delete_waiting(["waiting", ""]), "non-empty"),
    "negative release delay": (lambda q: q.release([(1, "x")], delay=-1), "must not be negative"),
    "negative lease": (lambda q: q.extend_lease(["x"], lease=-5), "must not be negative"),
    "naive min_lead time": (
        lambda q: q.offer("waiting", b"x", NAIVE, min_lead=timedelta(seconds=1)), "timezone"
    ),
    "batch with a long key": (
        lambda q: q.offer_batch([Offer("new1", b"x"), Offer(LONG_KEY, b"x")], chunk_size=1),
        "201 characters",
    ),
    "batch with a naive time": (
        lambda q: q.offer_batch([Offer("waiting", b"y", FUTURE), Offer("new", b"x", NAIVE)]),
        "timezone-aware",
    ),
    "batch with a str payload": (
        lambda q: q.offer_batch([("new1", b"x", None), ("new2", "x", None)]), "must be bytes"
    ),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_is_refused_and_changes_nothing(seeded: DelayedQueue, name: str) -> None:
    call, message = BAD_CALLS[name]
    with pytest.raises(InvalidInput, match=message):
        call(seeded)


def test_limits_are_inclusive(queue: DelayedQueue) -> None:
    """The refusals above are about the limit, not about long values in general."""
    long_kind = queue.with_kind("q" * 100)
    long_kind.offer("k" * 200, b"\x00binary\xff")
    env = long_kind.try_poll()
    assert env.key == "k" * 200 and env.payload == b"\x00binary\xff"


def test_offer_batch_with_one_bad_item_stores_nothing(queue: DelayedQueue) -> None:
    good = [Offer(f"k{i}", b"x") for i in range(10)]
    with pytest.raises(InvalidInput):
        queue.offer_batch([*good, Offer("bad", b"x", NAIVE)], chunk_size=2)
    assert queue.status() == []


@pytest.mark.parametrize(
    "table",
    ["x; drop table delayed_queue", "1abc", 'a"b', "t" * 32, "", "a-b", "Ärger", "a b"],
)
def test_bad_table_names_are_refused(seeded: DelayedQueue, table: str) -> None:
    with pytest.raises(InvalidInput, match="invalid table name"):
        DelayedQueue(seeded.db.url, table=table)


@pytest.mark.parametrize("timeout", [0, -1, timedelta(seconds=-1)])
def test_lease_must_be_positive(database_url: str, timeout: object) -> None:
    with pytest.raises(InvalidInput, match="acquire_timeout"):
        DelayedQueue(database_url, acquire_timeout=timeout)


def test_cron_input_is_validated(seeded: DelayedQueue) -> None:
    cron = CronService(seeded)
    msg = [CronMessage(FUTURE, b"x")]
    for prefix, match in [("a/b", "must not contain '/'"), ("", "non-empty"),
                          ("p" * 200, "the limit is 153")]:
        with pytest.raises(InvalidInput, match=match):
            cron.install_tick("h", prefix, msg)
    with pytest.raises(InvalidInput, match="config hash"):
        cron.uninstall_tick("a/b", "prefix")
    with pytest.raises(InvalidInput, match="occurrence must be timezone-aware"):
        cron.install_tick("h", "prefix", [CronMessage(NAIVE, b"x")])
    with pytest.raises(InvalidInput, match="schedule_interval"):
        cron.install("h", "prefix", timedelta(0), lambda now: msg)


# -- the database itself ---------------------------------------------------------------------


def test_unreachable_database_fails_fast_and_clearly() -> None:
    with pytest.raises(DatabaseUnavailable, match=r"127\.0\.0\.1:1/test unreachable") as err:
        DelayedQueue("postgresql://postgres:s3cret@127.0.0.1:1/test")
    assert "s3cret" not in str(err.value) and "***" in str(err.value), "password masked"


def test_a_server_that_hangs_up_is_tried_once() -> None:
    """Fast because it does not retry: a listener that closes every connection at once sees
    one connection attempt (libpq's own SSL/GSS fallbacks may open up to three), not the
    retry loop's six."""
    with hang_up_server() as (port, attempts):
        with pytest.raises(DatabaseUnavailable, match=f"127\\.0\\.0\\.1:{port}/test"):
            DelayedQueue(f"postgresql://postgres@127.0.0.1:{port}/test")
    assert 1 <= len(attempts) <= 3, attempts


def test_missing_database_is_named() -> None:
    with pytest.raises(DelayqError, match='"delayq_no_such_db" does not exist'):
        DelayedQueue(url_for("delayq_no_such_db"))


@pytest.mark.parametrize("url", ["mysql://root@localhost/db", "127.0.0.1:5432", ""])
def test_malformed_url_is_refused(url: str) -> None:
    with pytest.raises(InvalidInput, match="invalid database URL"):
        DelayedQueue(url)


def test_missing_table_without_migration_says_what_to_run(database_url: str) -> None:
    with DelayedQueue(database_url, table="never_migrated", ensure_schema=False) as q:
        with pytest.raises(SchemaMissing, match="delayq migrate"):
            q.offer("k", b"x")


def test_kombu_and_sqlalchemy_url_spellings_are_accepted(database_url: str) -> None:
    for scheme in ("delayq+postgresql", "postgres", "postgresql+psycopg"):
        url = database_url.replace("postgresql", scheme, 1)
        with DelayedQueue(url, kind="test") as q:
            assert q.count_waiting() == 0
