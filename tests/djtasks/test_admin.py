"""delayq's admin app (delayq_transport/django/admin) with Django's test client against the
suite's project (tests/django_project: ``django.contrib.admin`` and
``delayq_transport.django.admin`` installed): its four pages and their actions, under Django's
permissions, with Django's CSRF, reading and changing delayq's rows only through delayq's own
statements (no query of Django's reaches a delayq table).

End to end: a task fails for good in a real worker (in this process, on a thread), is found on
the results page, retried from there, and succeeds on its next attempt.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _dead_letters import dead_letters
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from delayq_transport.django._framework import TaskResultDoesNotExist, TaskResultStatus
from delayq_transport.django.admin.models import DeadLetter, PeriodicEntry, Result, Task
from delayq_transport.django.target import target
from delayq_transport.formats.celery import encode, kind_for, task_message

from .conftest import finished, running, sql, wait_until

ADMIN = "/admin/delayq_admin"
DELAYQ_TABLES = ("delayed_queue", "delayq_task_results", "delayq_schedule")


def user(name: str, *perms: str, superuser: bool = False) -> Client:
    """A logged-in client of a staff user with these permissions of the app."""
    found = User.objects.filter(username=name).first()
    if found is None:
        found = User.objects.create_user(name, password="x", is_staff=True,
                                         is_superuser=superuser)
    found.user_permissions.set(Permission.objects.filter(
        content_type__app_label="delayq_admin", codename__in=perms))
    client = Client()
    client.force_login(found)
    return client


def idents(response: Any) -> list[str]:
    return re.findall(r'<tr data-ident="([^"]+)"', response.content.decode())


def celery_task(name: str, eta: datetime, *, queue: str = "celery", retries: int = 0) -> str:
    msg = task_message(name, [1], {}, eta=eta, queue=queue, retries=retries)
    key = str(msg["headers"]["id"])
    target().queue().with_kind(kind_for(queue, 0)).offer(key, encode(msg), eta)
    return key


@pytest.fixture
def no_django_queries_on_delayq() -> Iterator[None]:
    """Whatever the test does through the admin, Django's own connection never reads or
    writes a delayq table: delayq's rows go through delayq's statements."""
    with CaptureQueriesContext(connection) as captured:
        yield
    touched = [q["sql"] for q in captured.captured_queries
               if any(t in q["sql"] for t in DELAYQ_TABLES)]
    assert touched == []


def test_the_pages_need_the_view_permission_and_the_actions_theirs(
        no_django_queries_on_delayq: None) -> None:
    key = celery_task("billing.remind", datetime.now(UTC) + timedelta(hours=1))
    assert Client().get(f"{ADMIN}/task/").status_code == 302  # to the login page
    nobody = user("nobody")
    assert nobody.get(f"{ADMIN}/task/").status_code == 403
    assert "delayq_admin" not in nobody.get("/admin/").content.decode()
    viewer = user("viewer", "view_task", "view_result", "view_deadletter",
                  "view_periodicentry")
    for page in ("task", "result", "deadletter", "periodicentry"):
        assert viewer.get(f"{ADMIN}/{page}/").status_code == 200, page
    listed = viewer.get(f"{ADMIN}/task/")
    assert idents(listed) != [] and key in listed.content.decode()
    assert 'name="action"' not in listed.content.decode()  # no action for a viewer
    row = idents(listed)[0]
    assert viewer.post(f"{ADMIN}/task/act/", {"action": "cancel", "ids": [row]}
                       ).status_code == 403
    runner = user("runner", "view_task", "change_task")
    page = runner.get(f"{ADMIN}/task/").content.decode()
    assert 'value="run_now"' in page and 'value="cancel"' not in page
    assert runner.post(f"{ADMIN}/task/act/", {"action": "cancel", "ids": [row]}
                       ).status_code == 403
    assert target().queue().with_kind("celery").get(key) is not None  # still there
    done = runner.post(f"{ADMIN}/task/act/", {"action": "run_now", "ids": [row]}, follow=True)
    assert "Run now: 1 done" in done.content.decode()
    stored = target().queue().with_kind("celery").get(key)
    assert stored is not None and stored.scheduled_at <= target().queue().now()
    canceller = user("canceller", "view_task", "delete_task")
    gone = canceller.post(f"{ADMIN}/task/act/", {"action": "cancel", "ids": [row]},
                          follow=True)
    assert "Cancel: 1 done" in gone.content.decode()
    assert target().queue().with_kind("celery").get(key) is None
    # The models never read: a queryset of them is empty without a statement.
    with CaptureQueriesContext(connection) as reads:
        assert [list(m.objects.all()) for m in (Task, Result, DeadLetter, PeriodicEntry)] == \
            [[], [], [], []]
    assert reads.captured_queries == []


def test_actions_need_django_csrf_token() -> None:
    key = celery_task("billing.remind", datetime.now(UTC) + timedelta(hours=1))
    admin_user = User.objects.filter(username="root").first() or \
        User.objects.create_superuser("root", password="x")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_user)
    page = strict.get(f"{ADMIN}/task/")
    row = idents(page)[0]
    assert strict.post(f"{ADMIN}/task/act/", {"action": "cancel", "ids": [row]}
                       ).status_code == 403
    assert target().queue().with_kind("celery").get(key) is not None
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token is not None
    assert strict.post(f"{ADMIN}/task/act/", {"action": "cancel", "ids": [row],
                                              "csrfmiddlewaretoken": token.group(1)}
                       ).status_code == 302
    assert target().queue().with_kind("celery").get(key) is None


def test_waiting_tasks_filter_page_and_show(no_django_queries_on_delayq: None) -> None:
    from shop import djtasks

    root = user("root", superuser=True)
    now = datetime.now(UTC)
    keys = [celery_task("billing.remind", now + timedelta(minutes=i)) for i in range(3)]
    retried = celery_task("billing.charge", now + timedelta(minutes=9), retries=2)
    django = djtasks.mail_add.enqueue(2, 3)
    listed = root.get(f"{ADMIN}/task/").content.decode()
    assert django.id in listed and all(k in listed for k in keys)
    assert "django:mail:0" in listed  # the kinds are the queue filter's choices
    mail = root.get(f"{ADMIN}/task/", {"kind": "django:mail:0"}).content.decode()
    assert django.id in mail and keys[0] not in mail
    retrying = root.get(f"{ADMIN}/task/", {"state": "retrying"}).content.decode()
    assert retried in retrying and keys[0] not in retrying
    charge = root.get(f"{ADMIN}/task/", {"task": "billing.ch*"}).content.decode()
    assert retried in charge and keys[0] not in charge
    # Keyset pages: "Next" carries a cursor, no page numbers, no count.
    from delayq_transport.django.admin import admin as pages

    pages.PAGE, saved = 2, pages.PAGE
    try:
        first = root.get(f"{ADMIN}/task/")
        nxt = re.search(r'href="\?([^"]*cursor=[^"]+)" id="delayq-next-page"',
                        first.content.decode())
        assert nxt is not None and len(idents(first)) == 2
        second = root.get(f"{ADMIN}/task/?" + nxt.group(1).replace("&amp;", "&"))
        assert set(idents(second)).isdisjoint(idents(first))
    finally:
        pages.PAGE = saved
    [row] = [i for i, cells in re.findall(r'<tr data-ident="(\d+)">(.*?)</tr>', listed, re.S)
             if django.id in cells]
    shown = root.get(f"{ADMIN}/task/{row}/change/").content.decode()
    assert "shop.djtasks.mail_add" in shown and "[2, 3]" in shown
    assert root.get(f"{ADMIN}/task/999999999/change/", follow=True).status_code == 200


def test_a_failed_task_is_found_retried_from_the_admin_and_succeeds(
        dj_url: str, no_django_queries_on_delayq: None) -> None:
    from shop import djtasks

    root = user("root", superuser=True)
    with running():
        failing = djtasks.flaky.enqueue("admin-retry", 3)  # @retry(2): 3 attempts fail
        other = djtasks.fail.enqueue("for good")
        ok = djtasks.add.enqueue(1, 2)
        for result in (failing, other, ok):
            finished(result)
        assert failing.status == TaskResultStatus.FAILED and failing.attempts == 3
        failed = root.get(f"{ADMIN}/result/", {"status": "FAILED"})
        assert set(idents(failed)) == {other.id, failing.id}
        assert ok.id in idents(root.get(f"{ADMIN}/result/"))
        assert idents(root.get(f"{ADMIN}/result/", {"task": "shop.djtasks.flaky"})) == \
            [failing.id]
        shown = root.get(f"{ADMIN}/result/{failing.id}/change/").content.decode()
        assert "admin-retry: attempt 3 fails" in shown and "attempt error 3" in shown
        done = root.post(f"{ADMIN}/result/act/", {"action": "retry", "ids": [failing.id]},
                         follow=True)
        assert "Retry: 1 done" in done.content.decode()

        def succeeded() -> bool:
            failing.refresh()
            return failing.status == TaskResultStatus.SUCCESSFUL

        wait_until(succeeded, "the retried task to succeed")
    assert failing.attempts == 4 and failing.return_value == 4 and len(failing.errors) == 3
    # Retrying a result that is not failed is refused, and said so.
    again = root.post(f"{ADMIN}/result/act/", {"action": "retry", "ids": [ok.id]}, follow=True)
    assert "Retry refused" in again.content.decode()
    # Discard: the result goes (get_result then says it does not exist).
    root.post(f"{ADMIN}/result/act/", {"action": "discard", "ids": [other.id]})
    with pytest.raises(TaskResultDoesNotExist):
        djtasks.fail.get_result(other.id)
    assert sql(dj_url, "SELECT count(*) FROM delayq_task_results WHERE id = %s",
               [other.id]) == [(0,)]


def test_dead_letters_are_retried_and_discarded(dj_url: str) -> None:
    dead_letters(dj_url, [("payments.charge", 1), ("mail.render", 2)], retries=2)
    root = user("root", superuser=True)
    page = root.get(f"{ADMIN}/deadletter/").content.decode()
    letters = idents(root.get(f"{ADMIN}/deadletter/"))
    assert len(letters) == 2 and "payments.charge broke" in page and "default (2)" in page
    shown = root.get(f"{ADMIN}/deadletter/{letters[0]}/change/").content.decode()
    assert "Traceback" in shown and "broke" in shown
    root.post(f"{ADMIN}/deadletter/act/", {"action": "retry", "ids": [letters[0]]})
    root.post(f"{ADMIN}/deadletter/act/", {"action": "discard", "ids": [letters[1]]})
    assert idents(root.get(f"{ADMIN}/deadletter/")) == []
    kinds = [r[0] for r in sql(dj_url, 'SELECT "pKind" FROM delayed_queue')]
    assert kinds == ["dramatiq:default"]  # the requeued one, back in its queue


def test_periodic_entries_are_listed_enabled_and_disabled(dj_url: str) -> None:
    from click.testing import CliRunner

    from delayq_transport.cli import main

    added = CliRunner().invoke(main, ["-d", dj_url, "beat", "add", "nightly",
                                      "reports.nightly", "--crontab", "0 3 * * *"])
    assert added.exit_code == 0, added.output
    root = user("root", superuser=True)
    page = root.get(f"{ADMIN}/periodicentry/")
    assert idents(page) == ["nightly"] and "reports.nightly" in page.content.decode()
    viewer = user("pviewer", "view_periodicentry")
    assert viewer.post(f"{ADMIN}/periodicentry/act/", {"action": "disable",
                                                        "ids": ["nightly"]}).status_code == 403
    root.post(f"{ADMIN}/periodicentry/act/", {"action": "disable", "ids": ["nightly"]})
    assert sql(dj_url, "SELECT enabled FROM delayq_schedule_entries WHERE name = 'nightly'"
               ) == [(False,)]
    root.post(f"{ADMIN}/periodicentry/act/", {"action": "enable", "ids": ["nightly"]})
    assert sql(dj_url, "SELECT enabled FROM delayq_schedule_entries WHERE name = 'nightly'"
               ) == [(True,)]


def test_a_missing_table_is_said_not_raised(dj_url: str) -> None:
    from django.test.utils import override_settings

    root = user("root", superuser=True)
    with override_settings(DELAYQ_TABLE="not_migrated", TASKS={}):
        page = root.get(f"{ADMIN}/task/")
    assert page.status_code == 200
    assert "delayq could not read its tables" in page.content.decode()


def test_a_setting_that_names_no_table_is_a_check_error() -> None:
    from django.core import checks
    from django.test.utils import override_settings

    assert [m for m in checks.run_checks() if m.id == "delayq_admin.E001"] == []
    with override_settings(DELAYQ_TABLE="bad-name!", TASKS={}):
        found = [m for m in checks.run_checks() if m.id == "delayq_admin.E001"]
    assert len(found) == 1 and "bad-name!" in found[0].msg
    with override_settings(DELAYQ_DATABASE="elsewhere", TASKS={}):
        found = [m for m in checks.run_checks() if m.id == "delayq_admin.E001"]
    assert len(found) == 1 and "no DATABASES entry 'elsewhere'" in found[0].msg


def test_queue_controls_are_shown_and_changed_under_the_change_permission(
        no_django_queries_on_delayq: None) -> None:
    """The queue controls page (docs/how-to/limits.md): every queue holding tasks, its pause
    and limits; ``view`` sees them, ``change`` pauses, resumes and limits; bad limits are
    refused naming them and change nothing."""
    celery_task("billing.remind", datetime.now(UTC) + timedelta(hours=1), queue="mail")
    page = f"{ADMIN}/queuecontrol/"
    viewer = user("control-viewer", "view_queuecontrol")
    assert "mail" in idents(viewer.get(page))
    assert viewer.post(f"{page}act/", {"action": "pause", "ids": ["mail"]}).status_code == 403
    operator = user("control-operator", "view_queuecontrol", "change_queuecontrol")
    done = operator.post(f"{page}act/", {"action": "pause", "ids": ["mail"]}, follow=True)
    assert "mail paused" in done.content.decode()
    operator.post(f"{page}act/", {"action": "limit", "ids": ["mail"], "concurrency": "3",
                                   "rate": "50/s", "key_concurrency": "", "key_rate": ""})
    [control] = target().queue().controls()
    assert (control.control.paused, control.control.concurrency, control.control.rate) == (
        True, 3, (50, 1000))
    refused = operator.post(f"{page}act/", {"action": "limit", "ids": ["mail"],
                                            "concurrency": "0"}, follow=True)
    assert "concurrency limit of &#x27;mail&#x27; must be a whole number above 0" in (
        refused.content.decode())
    operator.post(f"{page}act/", {"action": "resume", "ids": ["mail"]})
    shown = operator.get(page).content.decode()
    assert "50/s" in shown and target().queue().controls()[0].control.paused is False
