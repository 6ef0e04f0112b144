"""The option registries' checks (core/queue/options.py), as the ``django.tasks`` backend's
OPTIONS use them: a value is taken as given or refused with an error naming the option, the
value and what it expects; nothing is converted but an int of seconds widened to a float."""

from __future__ import annotations

import math
from typing import Any

import pytest

from delayq_transport.core import InvalidInput
from delayq_transport.django.options import TASK_OPTIONS

WHERE = "TASKS['default'] OPTIONS"


def parse(**values: Any) -> dict[str, Any]:
    return TASK_OPTIONS.parse(values, WHERE)


def test_nothing_given_is_every_default() -> None:
    assert parse() == {name: option.default for name, option in TASK_OPTIONS.items()}


@pytest.mark.parametrize(("name", "value", "expects"), [
    ("JOIN_ATOMIC", "false", "True or False"),
    ("JOIN_ATOMIC", 0, "True or False"),
    ("RETRIES", -1, "an int >= 0"),
    ("RETRIES", "3", "an int >= 0"),
    ("RETRIES", 2.5, "an int >= 0"),
    ("RETRIES", True, "an int >= 0"),
    ("POOL_SIZE", 0, "an int >= 1"),
    ("BACKOFF", -0.5, "a number of seconds >= 0"),
    ("BACKOFF", "1", "a number of seconds >= 0"),
    ("MAX_BACKOFF", math.inf, "a number of seconds >= 0"),
    ("LEASE", 0, "a number of seconds > 0"),
    ("POLLING_INTERVAL", math.nan, "a number of seconds > 0"),
    ("RESULT_RETENTION", "7d", "a number of seconds >= 0, or None (kept forever)"),
    ("TABLE", "my-table", "a table name"),
    ("DATABASE", "", "a non-empty string"),
    ("PERIODIC", [("a", "b")], "a dict"),
])
def test_a_bad_value_is_refused_naming_the_option_the_value_and_what_it_expects(
        name: str, value: Any, expects: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse(**{name: value})
    assert str(caught.value).startswith(f"{WHERE} {name} = {value!r}: expected {expects}")


def test_a_good_value_is_taken_as_given_and_seconds_read_as_floats() -> None:
    got = parse(RETRIES=3, LEASE=120, JOIN_ATOMIC=False, RESULT_RETENTION=None, TABLE="jobs",
                PERIODIC={"nightly": {}})
    assert (got["RETRIES"], got["JOIN_ATOMIC"], got["RESULT_RETENTION"], got["TABLE"],
            got["PERIODIC"]) == (3, False, None, "jobs", {"nightly": {}})
    assert got["LEASE"] == 120.0 and isinstance(got["LEASE"], float)


def test_an_unknown_option_is_named_with_the_known_ones() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse(RETRY=3, COLOUR="red")
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: unknown options 'COLOUR', 'RETRY' (did you mean "
                              "'RETRIES'?); the options are DATABASE, TABLE, ")
    assert all(name in message for name in TASK_OPTIONS)
