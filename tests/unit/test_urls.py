"""Database URL spellings (issue 26): what libpq is given, and what banners show."""

from __future__ import annotations

import kombu
import pytest

import delayq_transport  # noqa: F401  (registers the schemes)
from delayq_transport.core import InvalidInput
from delayq_transport.core.db import mask_password, normalize_url

MULTI = "delayq+postgresql://u:pw@h1:5451,h2:5452/db?target_session_attrs=read-write"
QUERY = "delayq+postgresql://u:pw@/db?host=h1,h2&port=5451,5452"
KOMBU = "delayq+postgresql://u:pw@h1:5451/db;delayq+postgresql://u:pw@h2:5452/db"


def test_libpq_forms_reach_libpq_as_written() -> None:
    assert normalize_url(MULTI) == MULTI.removeprefix("delayq+")
    assert normalize_url(QUERY) == QUERY.removeprefix("delayq+")
    assert normalize_url("delayq://u@h/db") == "postgresql://u@h/db"


def test_a_failover_list_becomes_one_multi_host_url_asking_for_a_primary() -> None:
    assert normalize_url(KOMBU) == \
        "postgresql://u:pw@h1:5451,h2:5452/db?target_session_attrs=read-write"
    # Parameters are kept as written (libpq decodes them; '+' is not a space to it), and a
    # target the user chose wins.
    assert normalize_url("postgresql://u@h1/db?options=-c%20a%3D1+2&target_session_attrs=any;"
                         "delayq://u@h2/db") == \
        "postgresql://u@h1,h2/db?options=-c%20a%3D1+2&target_session_attrs=any"


@pytest.mark.parametrize("bad", [
    "delayq://u@h1/db;delayq://v@h2/db",             # another user
    "delayq://u@h1/db;delayq://u@h2/other",          # another database
    "delayq://u@h1/db?sslmode=require;delayq://u@h2/db?sslmode=disable",
    "delayq://u@/db?host=h1;delayq://u@h2/db",       # a host libpq would not merge
])
def test_a_failover_list_libpq_cannot_try_as_one_url_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInput, match="failover list"):
        normalize_url(bad)


def test_passwords_are_masked_in_every_form() -> None:
    assert mask_password(MULTI) == \
        "delayq+postgresql://u:***@h1:5451,h2:5452/db?target_session_attrs=read-write"
    assert mask_password(KOMBU) == \
        "delayq+postgresql://u:***@h1:5451/db;delayq+postgresql://u:***@h2:5452/db"
    assert mask_password("postgresql://u@/db?host=h&password=pw&port=1") == \
        "postgresql://u@/db?host=h&password=***&port=1"
    assert mask_password("postgresql://u@h/db") == "postgresql://u@h/db"


@pytest.mark.parametrize("url, shown", [
    (MULTI, "delayq+postgresql://u:**@h1:5451,h2:5452/db?target_session_attrs=read-write"),
    (QUERY, "delayq+postgresql://u:**@/db?host=h1,h2&port=5451,5452"),
    (KOMBU, "delayq+postgresql://u:**@h1:5451/db;delayq+postgresql://u:**@h2:5452/db"),
    ("delayq://u:pw@h1:5451/db", "delayq://u:**@h1:5451/db"),
])
def test_kombu_renders_every_form_masked(url: str, shown: str) -> None:
    """``Connection.as_uri`` is the worker's and beat's banner: it raised ``ValueError: Port
    could not be cast to integer value`` on the multi-host form."""
    conn = kombu.Connection(url)
    assert conn.as_uri() == shown
    assert "pw" in conn.as_uri(include_password=True)


def test_kombu_failover_connects_each_alternate_as_a_primary() -> None:
    """kombu's alternates cannot carry parameters: each is asked for a read-write server,
    and a clone after a switch (kombu re-adds the ``delayq+`` prefix to the bare host) still
    names the host, not ``delayq+h2``."""
    conn = kombu.Connection(KOMBU)
    assert conn.transport._url == \
        "postgresql://u:pw@h1:5451/db?target_session_attrs=read-write"
    conn.switch(conn.alt[1])
    assert conn.transport._url == \
        "postgresql://u:pw@h2:5452/db?target_session_attrs=read-write"
    assert conn.clone().transport._url == conn.transport._url
    assert conn.as_uri() == \
        "delayq+postgresql://u:**@h1:5451/db;delayq+postgresql://u:**@h2:5452/db"


@pytest.mark.parametrize("conninfo", [
    "dbname=app user=u host=db port=5433",
    "host=/var/run/postgresql dbname=app",
    "dbname = 'my app' options='-c jit=off' password='a \\' b'",
    "host=h1,h2 port=5432,5433 dbname=app target_session_attrs=read-write",
])
def test_a_keyword_value_string_becomes_a_url_libpq_reads_the_same(conninfo: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    url = normalize_url(conninfo)
    assert url.startswith("postgresql://?")
    assert conninfo_to_dict(url) == conninfo_to_dict(conninfo)


def test_a_malformed_keyword_value_string_is_refused_without_its_password() -> None:
    with pytest.raises(InvalidInput, match="invalid connection string") as refused:
        normalize_url("dbname=app password=s3cret host")
    assert "s3cret" not in str(refused.value)


def test_passwords_of_keyword_value_strings_are_masked() -> None:
    assert mask_password("dbname=a password=s3cret user=u") == "dbname=a password=*** user=u"
    assert mask_password("password = 'a \\' b' dbname=a") == "password = *** dbname=a"
    assert "s3cret" not in mask_password(normalize_url("dbname=a password=s3cret"))
