"""The Django app's refusal of an ``atomic()`` block on another database than the broker's names
the Django settings to change (DELAYQ_DATABASE, CELERY_BROKER_URL, DELAYQ_JOIN_ATOMIC), as
docs/troubleshooting.md quotes it. Django's ``default`` connection is pointed at a database
of its own (``_djbeat``: Django configured once per process), the broker at the test's."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from _djbeat import django_database
from conftest import create_database, drop_database
from django.db import transaction

from delayq_transport import DelayedQueue, TransactionRefused
from delayq_transport.core.queue import set_implicit
from delayq_transport.django.apps import atomic_transaction


def test_an_atomic_block_on_another_database_is_refused_naming_the_setting(
        queue: DelayedQueue, database_url: str) -> None:
    other = f"delayq_django_{uuid.uuid4().hex[:8]}"
    try:
        with django_database(create_database(other)):
            set_implicit(atomic_transaction("default"))
            queue.offer("outside", b"x")  # outside atomic(): delayq's own connection
            with transaction.atomic(), pytest.raises(TransactionRefused) as refused:
                queue.offer("inside", b"x")
    finally:
        set_implicit(None)
        drop_database(other)
    message = str(refused.value)
    assert other in message and "nothing was published" in message
    assert "Django: DELAYQ_DATABASE = 'default' joins the atomic() blocks of " \
           "DATABASES['default']" in message
    assert "CELERY_BROKER_URL" in message and "DELAYQ_JOIN_ATOMIC = False" in message
    with psycopg.connect(database_url) as conn:
        assert [k for (k,) in conn.execute('SELECT "pKey" FROM delayed_queue')] == ["outside"]
