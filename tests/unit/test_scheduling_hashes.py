"""The scheduling engine keeps what is installed valid across upgrades: config hashes of
existing entries never change (a changed hash replaces every installed occurrence), and its own
crontab parser reads every field as Celery's does (the hash covers the expanded fields)."""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, crontab_parser, schedule, solar

from delayq_beat.entries import make_spec
from delayq_transport.core import InvalidInput
from delayq_transport.scheduling.entries import EntrySpec, entry_hash
from delayq_transport.scheduling.schedules import CRON_FIELDS, expand_field
from delayq_transport.scheduling.store import StoredEntry

UTC = ZoneInfo("UTC")
NY = ZoneInfo("America/New_York")
PARIS = ZoneInfo("Europe/Paris")


def _db_entry(name: str, definition: dict, **defaults: object) -> EntrySpec:
    return StoredEntry(name, definition, True, 0).spec(**defaults)


#: Hashes computed at acfa2b2 (before the engine), with the API of the time.
PINNED = [
    ("crontab_ny", lambda: make_spec(
        "report", "proj.tasks.report", crontab(minute="30", hour="7", day_of_week="mon-fri"),
        (1, 2), {"x": 1}, {"queue": "reports", "delayq_misfire": "skip", "delayq_grace": 30}),
     NY, "8aa792bec1426aaca03e65ccd4be9131"),
    ("every_10s", lambda: make_spec("tick", "celery_app.mark", 10.0, ["tick"], None,
                                    {"delayq_misfire": "run_all"}),
     UTC, "c7b299e7fd08c4a7001fa405d7ec7db3"),
    ("timedelta_hour", lambda: make_spec("hourly", "t.h", timedelta(hours=1), (), {},
                                         {"expires": 120, "priority": 5}),
     UTC, "a9bd54da5e3fc7ad7827b5526e10da3d"),
    ("schedule_object", lambda: make_spec("s", "t.s", schedule(timedelta(minutes=5))),
     PARIS, "d112465a49454a0d63f5ab7b4a4a9633"),
    ("crontab_steps", lambda: make_spec("e", "t.add", crontab(minute="*/15"), (1, 2),
                                        {"x": 1}, {"queue": "q"}),
     NY, "cd4f813a60719159cf9b53294d9bd6d4"),
    ("crontab_ints", lambda: make_spec(
        "m", "t.m", crontab(minute=0, hour=0, day_of_month="1,15", month_of_year="*/3"),
        options={"headers": {"a": 1}}),
     UTC, "ad39ba9b5d83afff86afa61b597b3804"),
    ("solar", lambda: make_spec("sun", "t.sun", solar("sunrise", 40.7, -74.0)),
     UTC, "6a8ba1de3a9fba8c659487e411108871"),
    ("db_crontab", lambda: _db_entry("dbe", {
        "task": "t.db", "schedule": {"type": "crontab", "minute": "*/5", "hour": "1-3",
                                     "day_of_week": "*", "day_of_month": "*",
                                     "month_of_year": "*"},
        "args": [1], "kwargs": {}, "options": {"queue": "celery", "delayq_misfire": "coalesce"}}),
     UTC, "f469a9e0309eed8765c5b594ffbfd1e2"),
    ("db_every", lambda: _db_entry("dbi", {
        "task": "t.db", "schedule": {"type": "every", "seconds": 30.0}, "args": [],
        "kwargs": {"k": "v"}, "options": {}}, default_misfire="skip", default_grace_s=5.0),
     UTC, "b25ba846a8e883413a3d0d39066451f8"),
]


@pytest.mark.parametrize(("make", "zone", "expected"), [p[1:] for p in PINNED],
                         ids=[p[0] for p in PINNED])
def test_config_hashes_of_existing_entries_are_unchanged(make, zone, expected) -> None:
    assert entry_hash(make(), zone) == expected


def test_dramatiq_periodic_hashes_are_unchanged() -> None:
    dramatiq = pytest.importorskip("dramatiq")
    from dramatiq.brokers.stub import StubBroker

    from delayq_transport.dramatiq.periodic import REGISTRY, periodic

    broker = StubBroker()
    try:
        @periodic(cron="30 7 * * mon-fri", tz="Europe/Paris", name="dramatiq:pin-morning")
        @dramatiq.actor(broker=broker, queue_name="reports", actor_name="morning_report")
        def morning() -> None: ...

        @periodic(every=60, args=(1,), kwargs={"a": "b"}, misfire="run_all", grace=10,
                  max_retries=0, broker_priority=2, name="dramatiq:pin-every")
        @dramatiq.actor(broker=broker, actor_name="every_minute")
        def every(x: int, a: str | None = None) -> None: ...

        got = {n: entry_hash(REGISTRY[n].spec, REGISTRY[n].zone)
               for n in ("dramatiq:pin-morning", "dramatiq:pin-every")}
    finally:
        broker.close()
        for n in ("dramatiq:pin-morning", "dramatiq:pin-every"):
            REGISTRY.pop(n, None)
    # At acfa2b2 (the entry names differ from the default, so these hashes are new pins;
    # the hash does not cover the name, so the defaults gave the same).
    assert got == {"dramatiq:pin-morning": "186f88489529a4381ae30d22d7c2d70f",
                   "dramatiq:pin-every": "bdaf9ed1b7df898f9dc062e25724529a"}


FIELDS = ["*", "0", "*/15", "1-5", "1-5/2", "fri-mon", "mon-fri", "sun", "jan-mar", "dec",
          "*/7", "3,4,5", "0-23/4", "10-2", "5,*/20", "15-45/10", "2-12/2", "29-31", "monday"]


@pytest.mark.parametrize("field", list(CRON_FIELDS))
@pytest.mark.parametrize("text", FIELDS)
def test_crontab_fields_expand_as_celery_does(field: str, text: str) -> None:
    count, first = CRON_FIELDS[field]
    try:
        celery = set(crontab_parser(count, first).parse(text))
        celery_ok = all(first <= v < first + count for v in celery)
    except (ValueError, crontab_parser.ParseException):
        celery_ok = False
    if not celery_ok:
        with pytest.raises(InvalidInput):
            expand_field(text, count, first)
    else:
        assert expand_field(text, count, first) == celery


@pytest.mark.parametrize("bad", ["", "1,,2", "*/", "1-", "*/0", "-1", "60", "x"])
def test_bad_minute_fields_are_refused_with_the_reason(bad: str) -> None:
    with pytest.raises(InvalidInput):
        expand_field(bad, 60, 0)
