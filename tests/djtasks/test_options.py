"""The backend's OPTIONS, read through their registry (delayq_transport/django/options.py):
each one's default when it is not given, and a backend that refuses them, for a value of the
wrong kind (never converted: ``"false"`` is not False) and for an unknown name: its check
reports each one (``delayq.E007``: Django makes every backend to ask for its checks, so
making it must not raise), and enqueue, get_result and a worker (which run no checks) raise
``ImproperlyConfigured`` naming the option, the value and what it expects. The same
``ImproperlyConfigured`` for a ``DATABASE`` that is not in ``DATABASES``, in place of delayq's
internal ``InvalidInput``. The check through a real ``manage.py check``: test_checks.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test.utils import override_settings

from delayq_transport.django._framework import task_backends
from delayq_transport.django.backend import retry
from delayq_transport.django.options import TASK_OPTIONS
from delayq_transport.django.tasks import DelayqBackend

BACKEND = "delayq_transport.django.tasks.DelayqBackend"
#: The backend's attribute for each option.
ATTRIBUTES = {"DATABASE": "database", "TABLE": "table", "JOIN_ATOMIC": "join_atomic",
              "RETRIES": "retries", "BACKOFF": "backoff", "MAX_BACKOFF": "max_backoff",
              "LEASE": "lease", "RESULT_RETENTION": "result_retention",
              "DEAD_LETTER_RETENTION": "dead_letter_retention", "SCHEMA_WAIT": "schema_wait",
              "POLLING_INTERVAL": "polling_interval", "POOL_SIZE": "pool_size",
              "PERIODIC": "periodic", "PERIODIC_SOURCE": "periodic_source",
              "PERIODIC_REFRESH": "periodic_refresh"}


def backend(**options: Any) -> DelayqBackend:
    return DelayqBackend("x", {"QUEUES": ["default"], "OPTIONS": options})


def test_every_option_has_its_documented_default() -> None:
    assert set(ATTRIBUTES) == set(TASK_OPTIONS)
    made = backend()
    assert {name: getattr(made, attr) for name, attr in ATTRIBUTES.items()} == {
        "DATABASE": "default", "TABLE": "delayed_queue", "JOIN_ATOMIC": True, "RETRIES": 0,
        "BACKOFF": 1.0, "MAX_BACKOFF": 3600.0, "LEASE": 60.0, "RESULT_RETENTION": 7 * 86400.0,
        "DEAD_LETTER_RETENTION": 7 * 86400.0, "SCHEMA_WAIT": 600.0, "POLLING_INTERVAL": 5.0,
        "POOL_SIZE": 8, "PERIODIC": {}, "PERIODIC_SOURCE": "settings", "PERIODIC_REFRESH": 60.0}


def test_given_values_are_taken_as_given() -> None:
    made = backend(DATABASE="default", TABLE="jobs", JOIN_ATOMIC=False, RETRIES=3, BACKOFF=0,
                   MAX_BACKOFF=30, LEASE=0.5, RESULT_RETENTION=None, POLLING_INTERVAL=1,
                   POOL_SIZE=2, PERIODIC={})
    assert (made.table, made.join_atomic, made.retries, made.backoff, made.max_backoff,
            made.lease, made.result_retention, made.polling_interval, made.pool_size) == (
        "jobs", False, 3, 0.0, 30.0, 0.5, None, 1.0, 2)


@pytest.mark.parametrize(("name", "value", "expects"), [
    ("JOIN_ATOMIC", "false", "True or False"),          # bool("false") would be True
    ("RETRIES", "3", "an int >= 0"),                    # a string of digits
    ("RETRIES", -1, "an int >= 0"),                     # out of range
    ("RETRIES", 1.5, "an int >= 0"),                    # int(1.5) would be 1
    ("POOL_SIZE", 0, "an int >= 1"),
    ("BACKOFF", "1s", "a number of seconds >= 0"),
    ("LEASE", 0, "a number of seconds > 0"),
    ("PERIODIC_SOURCE", "beat", "one of 'settings', 'admin', 'both'"),
    ("PERIODIC_REFRESH", 0, "a number of seconds > 0"),
    ("POLLING_INTERVAL", True, "a number of seconds > 0"),  # True is an int in Python
    ("RESULT_RETENTION", -1, "a number of seconds >= 0, or None (kept forever)"),
    ("TABLE", "queue; DROP", "a table name"),
    ("DATABASE", None, "a non-empty string"),
    ("PERIODIC", ["nightly"], "a dict"),
])
def test_a_bad_value_is_refused_naming_the_option(name: str, value: Any, expects: str) -> None:
    refused = backend(**{name: value})
    [error] = refused.check()
    assert error.id == "delayq.E007"
    assert error.msg.startswith(f"TASKS['x'] OPTIONS {name} = {value!r}: expected {expects}")
    for use in (refused.url, lambda: refused.get_result("any")):
        with pytest.raises(ImproperlyConfigured) as caught:
            use()
        assert str(caught.value) == error.msg


def test_an_unknown_option_is_refused_naming_it_and_the_known_ones() -> None:
    refused = backend(RETRY=3, LEASE=0)
    [unknown, lease] = [m.msg for m in refused.check()]  # every problem, one message each
    assert unknown.startswith("TASKS['x'] OPTIONS: unknown option 'RETRY' (did you mean "
                              "'RETRIES'?); the options are ")
    assert all(name in unknown for name in TASK_OPTIONS)
    assert lease == "TASKS['x'] OPTIONS LEASE = 0: expected a number of seconds > 0"
    with pytest.raises(ImproperlyConfigured) as caught:
        refused.url()
    assert str(caught.value) == f"{unknown}; {lease}"


def test_djangos_handler_makes_it_and_its_first_use_raises(dj_url: str) -> None:
    from shop import djtasks

    bad = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "mail"],
                       "OPTIONS": {"JOIN_ATOMIC": "no"}}}
    with override_settings(TASKS=bad):
        assert [m.id for m in task_backends["default"].check()] == ["delayq.E007"]
        with pytest.raises(ImproperlyConfigured, match=r"JOIN_ATOMIC = 'no': expected True "):
            djtasks.add.enqueue(1, 1)


def test_a_database_alias_not_in_databases_is_improperly_configured(dj_url: str) -> None:
    """Not delayq's internal InvalidInput: what Django raises for a setting that is wrong."""
    from shop import djtasks

    absent = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "mail"],
                          "OPTIONS": {"DATABASE": "nope"}}}
    with override_settings(TASKS=absent):
        for use in (lambda: djtasks.add.enqueue(1, 1), lambda: djtasks.add.get_result("x")):
            with pytest.raises(ImproperlyConfigured) as caught:
                use()
            assert str(caught.value).startswith(
                "TASKS['default']: OPTIONS DATABASE = 'nope' is not in DATABASES (have: "
                "default); name the DATABASES alias")


@pytest.mark.parametrize(("retries", "backoff", "message"), [
    (True, None, "@retry retries = True: expected an int >= 0"),
    (-1, None, "@retry retries = -1: expected an int >= 0"),
    (2, "1", "@retry backoff = '1': expected a number of seconds >= 0"),
    (2, -1, "@retry backoff = -1: expected a number of seconds >= 0"),
])
def test_a_tasks_own_retry_policy_is_checked_as_the_backends_options(
        retries: Any, backoff: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        retry(retries, backoff=backoff)
    assert str(caught.value) == message
    marked = retry(3, backoff=2)(lambda: None)
    assert (marked.delayq_retries, marked.delayq_backoff) == (3, 2.0)  # type: ignore[attr-defined]
