"""Import mode's blind spot made visible, against real PostgreSQL and django-celery-beat's own
models: after ``delayq beat import --from django-celery-beat --disable-source``, an edit in the
admin of an imported task changes nothing that runs; ``delayq beat list`` marks the entry, and a
beat (not in admin mode) logs one warning per change."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from _captured import capture
from _djbeat import django_database
from _tables import rich_tables
from celery import Celery
from click.testing import CliRunner
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask, PeriodicTasks

from delayq_beat import Scheduler
from delayq_transport.cli import main

IMPORT = ["beat", "import", "--from", "django-celery-beat", "--disable-source"]
COLUMN = "source changed"
HERE = "tests/integration/test_beat_import_changes.py"


@pytest.fixture
def imported(database_url: str) -> Iterator[str]:
    """Four tasks made by django-celery-beat's models, imported with --disable-source."""
    with django_database(database_url):
        every, _ = IntervalSchedule.objects.get_or_create(every=30, period="seconds")
        cron = CrontabSchedule.objects.create(minute="5", hour="*", timezone="UTC")
        for name in ("edited", "enabled", "deleted"):
            PeriodicTask.objects.create(name=name, task="proj.tasks.tick", interval=every,
                                        args="[1]", start_time=datetime(2025, 1, 1, tzinfo=UTC))
        PeriodicTask.objects.create(name="untouched", task="proj.tasks.tock", crontab=cron)
        done = CliRunner().invoke(main, ["-d", database_url, *IMPORT])
        assert done.exit_code == 0, done.output
        assert set(PeriodicTask.objects.filter(enabled=False).values_list("name", flat=True)) \
            == {"edited", "enabled", "deleted", "untouched"}
        yield database_url


def edit_in_the_admin() -> None:
    """What the admin does: a form save (args), the bulk 'enable' action, a delete."""
    task = PeriodicTask.objects.get(name="edited")
    task.args = "[2]"
    task.save()
    PeriodicTask.objects.filter(name="enabled").update(enabled=True)
    PeriodicTasks.update_changed()
    PeriodicTask.objects.get(name="deleted").delete()


def beat_list(url: str) -> str:
    done = CliRunner().invoke(main, ["-d", url, "beat", "list"])
    assert done.exit_code == 0, done.output
    return done.output


def marked(out: str) -> dict[str, str]:
    """Entry -> its cell of the column (wrapped lines joined); no column: nothing marked."""
    titles, body = rich_tables(out)[0]
    if COLUMN not in titles:
        return {}
    col, name, cells = titles.index(COLUMN), "", {}
    for row in body:
        name = row[0] or name
        cells[name] = " ".join(x for x in (cells.get(name, ""), row[col]) if x)
    return cells


def test_beat_list_marks_entries_edited_in_the_admin_after_the_import(imported: str) -> None:
    before = beat_list(imported)
    assert marked(before) == {} and "untouched" in before
    edit_in_the_admin()
    after = beat_list(imported)
    cells = marked(after)
    assert cells == {"edited": "args", "enabled": "enabled again", "deleted": "deleted",
                     "untouched": "-"}
    lines = after.splitlines()  # each change said in full on one line, below the table
    assert "entry 'edited': changed in django-celery-beat after the import (args)" in lines
    assert "entry 'deleted': deleted in django-celery-beat after the import" in lines
    assert any(line.startswith("import mode ignores edits in django-celery-beat") for line in lines)
    said = [line for line in lines if line.startswith(("entry 'edited'", "import mode"))]
    capture("admin-edit-beat-list",
            f"{HERE}::test_beat_list_marks_entries_edited_in_the_admin_after_the_import",
            command=f"delayq -d {imported} beat list", output="\n".join(["[the table]", *said]))
    again = CliRunner().invoke(main, ["-d", imported, "beat", "import", "--from",
                                      "django-celery-beat"])  # takes the edits
    assert again.exit_code == 0, again.output
    taken = marked(beat_list(imported))
    assert taken == {"edited": "-", "enabled": "-", "deleted": "deleted", "untouched": "-"}


def test_a_beat_warns_once_per_change(imported: str,
                                      caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("changes_t", broker="delayq+" + imported, set_as_current=False)
    app.conf.update(delayq_beat_check_tasks=False, delayq_beat_refresh_interval=5,
                    delayq_beat_horizon=60, result_expires=None)
    sched = Scheduler(app)
    caplog.set_level(logging.WARNING, logger="delayq_beat")

    def warned() -> list[str]:
        found = [r.getMessage() for r in caplog.records if "after the import" in r.getMessage()]
        caplog.clear()
        return found

    try:
        sched.refresh()
        assert warned() == []
        edit_in_the_admin()
        sched.refresh()
        first = warned()
        assert len(first) == 3 and all("run `delayq beat import" in m for m in first)
        assert sum("'edited'" in m and "(args)" in m for m in first) == 1
        capture("admin-edit-beat-log", f"{HERE}::test_a_beat_warns_once_per_change",
                log=next(m for m in first if "'edited'" in m))
        assert sum("'enabled'" in m and "(enabled again)" in m for m in first) == 1
        sched.refresh()
        sched.refresh()
        assert warned() == []  # the same changes: said once
        task = PeriodicTask.objects.get(name="untouched")
        task.crontab = CrontabSchedule.objects.create(minute="7", hour="*", timezone="UTC")
        task.save()
        sched.refresh()
        again = warned()
        assert len(again) == 1 and "'untouched'" in again[0] and "(schedule)" in again[0]
    finally:
        sched.close()
