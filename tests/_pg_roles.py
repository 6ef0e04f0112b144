"""Least-privilege roles for a test database, granted with what ``delayq grants`` prints.

Roles are cluster-global: each gets a unique name and is dropped (with its privileges) at exit,
so parallel test runs and other engineers' tests never see them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from click.testing import CliRunner

from delayq_transport.cli import main


def role_url(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


def grant_text(profile: str, role: str, table: str = "delayed_queue") -> str:
    """The GRANTs exactly as the CLI prints them (so the test also proves they run)."""
    result = CliRunner().invoke(main, ["--table", table, "grants", "--role", role,
                                       "--as", profile])
    assert result.exit_code == 0, result.output
    return result.output


@contextmanager
def roles(database_url: str, *profiles: str) -> Iterator[dict[str, str]]:
    """LOGIN roles (one per profile) granted on this database; yields profile -> libpq URL."""
    names = {p: f"dq_{p}_{uuid.uuid4().hex[:8]}" for p in profiles}
    with psycopg.connect(database_url, autocommit=True) as admin:
        for profile, name in names.items():
            admin.execute(f'CREATE ROLE "{name}" LOGIN')
            admin.execute(grant_text(profile, name))
    try:
        yield {p: role_url(database_url, n) for p, n in names.items()}
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            for name in names.values():
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE usename = %s", (name,))
                admin.execute(f'DROP OWNED BY "{name}"')
                admin.execute(f'DROP ROLE "{name}"')


@contextmanager
def bare_role(database_url: str, prefix: str = "dq51") -> Iterator[str]:
    """A LOGIN role granted nothing (PostgreSQL 15: not even CREATE on public), dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{name}" LOGIN')
    try:
        yield name
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE usename = %s", (name,))
            admin.execute(f'DROP OWNED BY "{name}"')
            admin.execute(f'DROP ROLE "{name}"')


@contextmanager
def before_migrate(profile: str = "worker") -> Iterator[tuple[str, str, Callable[[], None]]]:
    """A deploy where ``delayq migrate`` runs beside the new workers: an empty database, a
    LOGIN role that may not create delayq's tables there, and the release step (``delayq
    migrate`` as the owner, then the role's grants as ``delayq grants`` prints them). Yields
    (the owner's URL, the role's URL, the release step)."""
    from conftest import create_database, drop_database

    db = f"delayq_t_{uuid.uuid4().hex[:12]}"
    owner = create_database(db)
    name = f"dq_{profile}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(owner, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{name}" LOGIN')

    def release() -> None:
        migrated = CliRunner().invoke(main, ["-d", owner, "migrate"])
        assert migrated.exit_code == 0, migrated.output
        with psycopg.connect(owner, autocommit=True) as admin:
            admin.execute(grant_text(profile, name))

    try:
        yield owner, role_url(owner, name), release
    finally:
        drop_database(db)
        with psycopg.connect(url_for_postgres(owner), autocommit=True) as admin:
            admin.execute(f'DROP ROLE "{name}"')


def url_for_postgres(url: str) -> str:
    """The maintenance database of the server ``url`` is on (to drop what lives in none)."""
    return urlunsplit(urlsplit(url)._replace(path="/postgres"))
