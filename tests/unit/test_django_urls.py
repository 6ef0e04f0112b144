"""delayq's URL from a Django ``DATABASES`` entry (issue 36): what Django's PostgreSQL backend
would hand libpq, as Celery's ``broker_url`` and as a plain libpq URL."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from delayq_transport.core import InvalidInput
from delayq_transport.django import broker_url, database_url

ENGINE = "django.db.backends.postgresql"


@pytest.mark.parametrize("entry, libpq", [
    ({"ENGINE": ENGINE, "NAME": "app", "USER": "web", "PASSWORD": "p@ss:w/rd", "HOST": "db",
      "PORT": "5433", "OPTIONS": {"sslmode": "require", "isolation_level": 2, "pool": True}},
     {"dbname": "app", "user": "web", "password": "p@ss:w/rd", "host": "db", "port": "5433",
      "sslmode": "require"}),
    ({"ENGINE": ENGINE, "NAME": "app", "USER": "", "PASSWORD": "", "HOST": "", "PORT": ""},
     {"dbname": "app"}),
    ({"ENGINE": ENGINE, "NAME": "app", "HOST": "/var/run/postgresql", "PORT": 5432},
     {"dbname": "app", "host": "/var/run/postgresql", "port": "5432"}),
    ({"ENGINE": ENGINE, "NAME": "", "OPTIONS": {"service": "mysvc"}}, {"service": "mysvc"}),
    ({"ENGINE": ENGINE, "NAME": None, "OPTIONS": {"service": "x"}}, {"dbname": "postgres"}),
    ({"ENGINE": ENGINE, "NAME": "app", "HOST": "h1,h2", "PORT": "5432,5433"},
     {"dbname": "app", "host": "h1,h2", "port": "5432,5433"}),
])
def test_a_databases_entry_gives_what_djangos_backend_gives_libpq(entry: dict[str, object],
                                                                  libpq: dict[str, str]) -> None:
    url = database_url(entry)
    assert conninfo_to_dict(url) == libpq
    assert broker_url(entry) == "delayq+" + url


def test_a_plain_host_reads_as_a_url() -> None:
    entry = {"ENGINE": ENGINE, "NAME": "app", "USER": "web", "PASSWORD": "pw", "HOST": "db",
             "PORT": "5432", "OPTIONS": {"application_name": "shop web"}}
    assert broker_url(entry) == \
        "delayq+postgresql://web:pw@db:5432/app?application_name=shop%20web"


def test_another_engine_is_refused() -> None:
    with pytest.raises(InvalidInput, match="needs PostgreSQL"):
        database_url({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"})
