"""The backend's OPTIONS, read through their registry (delayq_transport/django/options.py):
each one's default when it is not given, and a backend that refuses to be made, with
``ImproperlyConfigured`` naming the option, the value and what it expects, for a value of the
wrong kind (never converted: ``"false"`` is not False) and for an unknown name. Django makes
the backend from ``TASKS`` on first use, so the error reaches the first enqueue too."""

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
        "POLLING_INTERVAL": 5.0, "POOL_SIZE": 8, "PERIODIC": {}, "PERIODIC_SOURCE": "settings",
        "PERIODIC_REFRESH": 60.0}


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
    with pytest.raises(ImproperlyConfigured) as caught:
        backend(**{name: value})
    assert str(caught.value).startswith(
        f"TASKS['x'] OPTIONS {name} = {value!r}: expected {expects}")


def test_an_unknown_option_is_refused_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ImproperlyConfigured) as caught:
        backend(RETRY=3)
    message = str(caught.value)
    assert message.startswith("TASKS['x'] OPTIONS: unknown option 'RETRY' (did you mean "
                              "'RETRIES'?); the options are ")
    assert all(name in message for name in TASK_OPTIONS)


def test_djangos_handler_raises_it_on_first_use_of_the_backend(dj_url: str) -> None:
    from shop import djtasks

    bad = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "mail"],
                       "OPTIONS": {"JOIN_ATOMIC": "no"}}}
    with override_settings(TASKS=bad):
        with pytest.raises(ImproperlyConfigured, match=r"JOIN_ATOMIC = 'no': expected True "):
            task_backends["default"]  # noqa: B018
        with pytest.raises(ImproperlyConfigured, match="JOIN_ATOMIC"):
            djtasks.add.enqueue(1, 1)


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
