"""Django's own tests of its task framework, and django-tasks-db's tests, run against delayq's
backend (issue 44). A developer tool: not part of the suite, not run by CI.

Its input is a copy of the upstream tests fetched beforehand: Django's ``tests/tasks`` (the
6.0 line; Django's sdist does not ship it) and django-tasks-db's ``tests/``. Neither is in this
repository (their code is Django's and django-tasks-db's, under their own licences: never copy
it here), and CI has no network to fetch them, so CI cannot run this. tests/djtasks states the
same contract in our own words and asserts every difference as such; this tool checks those
words against the originals when either side changes. docs/how-to/django-tasks.md lists the
differences. Usage (Python 3.12, Django 6)::

    PYTHONPATH=$PWD /work/venv312/bin/python tests/upstream/run.py \\
        --django /tmp/upstream/django-tasks-tests/tasks \\
        --tasks-db /tmp/upstream/django-tasks-db/tests [-v]

Last run (issue 44), Django 6.0.10 and django-tasks-db 0.13.0: Django's tests/tasks of the 6.0
line (test_tasks.py and test_custom_backend.py at django/django 66e0a0d3, test_dummy_backend.py
at 91dc69b1, test_immediate_backend.py at 9e2a2365, tasks.py at b931156c; an empty
``__init__.py``), django-tasks-db's tests/ at 88c80421 (its main with "Remove django-tasks
dependency" merged, the nearest to 0.13.0 whose tests import ``django.tasks``). Counts: test_tasks
32 passed of 34 (2 n/a), test_dummy_backend 12 passed and 1 differing of 17 (4 n/a),
test_immediate_backend 13 passed and 5 differing of 19 (1 n/a), test_custom_backend 5 n/a,
django-tasks-db's tests.py 10 passed of 96 (86 n/a).

How: a fresh PostgreSQL database on ``DELAYQ_TEST_DATABASE_URL``'s server (dropped at the
end), the settings of tests/upstream/upstream_settings.py. The upstream test code runs as it
is; each ``TASKS`` entry it configures whose backend is one of these is made delayq's
(``TaskBackendHandler.create_connection``):

* Django's ``DummyBackend``: :class:`AsDummy`, delayq's backend plus the two test helpers
  Django's tests call on the Dummy (``results``: every task in the table, read back through
  ``get_result``; ``clear()``: the harness' tables emptied);
* Django's ``ImmediateBackend``: :class:`AsImmediate`, delayq's backend whose ``enqueue``
  returns once delayq's worker (one, on a thread of this process, on a table of its own) ran
  the task: Django's tests of an executed task's result then check delayq's worker;
* django-tasks-db's ``DatabaseBackend``: delayq's backend, under the tests' own settings (the
  name ``DatabaseBackend`` in their module names it too: they compare a signal's sender).

Every upstream test has a verdict in :data:`VERDICTS`: ``applies`` (must pass; the default),
``differs`` (a deliberate difference, asserted as such in tests/djtasks: it must fail here,
else the list is stale) or ``n/a`` (about another backend's internals, or no backend at all:
not run), each with its reason. Exit status 0 when every applicable test passed and every
difference still differs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import sys
import tempfile
import threading
import traceback
import unittest
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

HERE = Path(__file__).resolve().parent
BASE_URL = os.environ.get("DELAYQ_TEST_DATABASE_URL",
                          "postgresql://postgres@127.0.0.1:5432/postgres")

APPLIES, DIFFERS, NA = "applies", "differs", "n/a"
Verdict = tuple[str, str]

#: The queue table of the Dummy's and django-tasks-db's stand-ins, and of the Immediate's.
MAIN_TABLE = "delayed_queue"
IMMEDIATE_TABLE = "delayq_upstream_immediate"
#: Longest wait for the worker to take and finish one task (a bounded wait, never a sleep).
RUN_TIMEOUT_S = 30.0

DUMMY = "django.tasks.backends.dummy.DummyBackend"
IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
DATABASE = "django_tasks_db.DatabaseBackend"

_IDENTITY = (NA, "asserts which class the settings name (the substitution makes it delayq's)")
_ATOMIC = (DIFFERS, "inside atomic() delayq writes the task in the caller's transaction "
                    "(JOIN_ATOMIC, on by default): nothing sees it, no worker runs it, before "
                    "the commit, and a rollback takes it back; Django's backends take it at "
                    "once. Ours: test_backend.py::test_a_task_enqueued_inside_atomic_is_not_"
                    "there_before_the_commit_unlike_djangos_backends")
_DB_MODEL = (NA, "django-tasks-db's model (DBTaskResult), its columns, indexes or migrations")
_DB_QUERIES = (NA, "counts the queries on Django's connection (assertNumQueries): delayq reads "
                   "and writes through its own pool outside atomic(); the rest of the test is "
                   "Django's test_dummy_backend's, which applies")

#: module -> {"Class.test" | "Class.*" | "*": (verdict, reason)}; unlisted tests apply.
VERDICTS: dict[str, dict[str, Verdict]] = {
    "tasks.test_tasks": {
        "TaskTestCase.test_using_correct_backend": _IDENTITY,
        "TaskTestCase.test_get_backend": _IDENTITY,
    },
    "tasks.test_dummy_backend": {
        "DummyBackendTestCase.test_using_correct_backend": _IDENTITY,
        "DummyBackendTestCase.test_refresh_result": (
            NA, "changes the Dummy's in-memory result and expects refresh() to read it: "
                "delayq's results change by a worker's run (test_worker.py refreshes after one)"),
        "DummyBackendTestCase.test_refresh_result_async": (
            NA, "as test_refresh_result, with arefresh()"),
        "DummyBackendTestCase.test_clear": (
            NA, "clear() is the Dummy's test helper (here the harness'), not a backend's API"),
        "DummyBackendTransactionTestCase.test_doesnt_wait_until_transaction_commit_by_default":
            _ATOMIC,
    },
    "tasks.test_immediate_backend": {
        "ImmediateBackendTestCase.test_using_correct_backend": _IDENTITY,
        "ImmediateBackendTestCase.test_throws_keyboard_interrupt": (
            DIFFERS, "the task runs in a worker, not in enqueue()'s caller: a KeyboardInterrupt "
                     "(or SystemExit) it raises fails the task, recorded with its traceback, "
                     "and never reaches the code that enqueued it. Ours: test_worker.py::test_a_"
                     "task_that_raises_keyboardinterrupt_fails_and_the_worker_goes_on"),
        "ImmediateBackendTestCase.test_cannot_get_result": (
            DIFFERS, "delayq keeps results (supports_get_result): get_result reads them from "
                     "PostgreSQL, in any process. Ours: test_backend.py::test_the_backend_"
                     "supports_everything_django_asks_of_a_production_backend"),
        "ImmediateBackendTestCase.test_cannot_refresh_result": (
            DIFFERS, "as test_cannot_get_result: refresh() reads the stored result. Ours: "
                     "test_backend.py::test_enqueue_writes_a_row_and_any_reader_gets_the_"
                     "result_from_the_database"),
        "ImmediateBackendTestCase.test_cannot_pass_run_after": (
            DIFFERS, "delayq defers (supports_defer): run_after is when the task is due. Ours: "
                     "test_worker.py::test_run_after_is_waited_for"),
        "ImmediateBackendTransactionTestCase.test_doesnt_wait_until_transaction_commit_by_default":
            _ATOMIC,
    },
    "tasks.test_custom_backend": {
        "*": (NA, "tests BaseTaskBackend through backend classes of its own: no backend of "
                  "Django's to replace"),
    },
    # Pre-release (Django 6.0 has no django.tasks.utils); listed for a copy that has it.
    "tasks.test_utils": {"*": (NA, "django.tasks.utils' helpers: no backend")},
    "tests.tests": {
        "DatabaseBackendTestCase.test_using_correct_backend": _IDENTITY,
        "DatabaseBackendTestCase.test_enqueue_task": _DB_QUERIES,
        "DatabaseBackendTestCase.test_get_result": _DB_QUERIES,
        "DatabaseBackendTestCase.test_refresh_result": (
            NA, "writes an outcome into django-tasks-db's model; delayq's come from a worker "
                "(test_worker.py)"),
        "DatabaseBackendTestCase.test_refresh_result_async": (
            NA, "as test_refresh_result, with arefresh()"),
        "DatabaseBackendTestCase.test_invalid_task_path": (
            NA, "django-tasks-db's model; delayq's worker fails a task whose path is not a "
                "task: test_worker.py::test_a_task_whose_path_names_no_task_fails_"
                "without_running"),
        "DatabaseBackendTestCase.test_missing_task_path": (
            NA, "as test_invalid_task_path (the module is gone)"),
        "DatabaseBackendTestCase.test_task_name": _DB_MODEL,
        "DatabaseBackendTestCase.test_database_backend_app_missing": (
            NA, "names django-tasks-db's app; delayq's check names its own (delayq.W001): "
                "test_backend.py::test_check_warns_when_the_app_is_not_installed"),
        "DatabaseBackendTestCase.test_priority_range_check": _DB_MODEL,
        "DatabaseBackendTestCase.test_doesnt_wait_until_transaction_commit": (
            NA, "counts django-tasks-db's model rows; the contract is delayq's too (written in "
                "the caller's transaction, seen by others at the commit): "
                "test_backend.py::test_enqueue_inside_atomic_joins_the_transaction"),
        "DatabaseBackendTestCase.test_index_scan_for_ready": _DB_MODEL,
        "DatabaseBackendTestCase.test_run_after_tz": _DB_MODEL,
        "DatabaseBackendTestCase.test_run_after_null_0016_migration": _DB_MODEL,
        "DatabaseBackendTestCase.test_custom_id_function": (
            NA, "django-tasks-db's ID option (delayq's ids are UUID4s)"),
        "DatabaseBackendTestCase.test_unknown_id_function": (NA, "django-tasks-db's ID option"),
        "DatabaseBackendTestCase.test_postgres_db_id_function": (
            NA, "django-tasks-db's ID option"),
        "DatabaseBackendTestCase.test_postgres_id_function_expression": (
            NA, "django-tasks-db's ID option"),
        "DatabaseBackendWorkerTestCase.*": (
            NA, "drives django-tasks-db's db_worker command on its model; delayq's worker "
                "keeps the same contract (results, failures, odd exceptions and return values, "
                "run_after and priority order, queues, context): test_worker.py"),
        "DatabaseTaskResultTestCase.*": (NA, "row locking of django-tasks-db's model"),
        "ConnectionExclusiveTranscationTestCase.*": (
            NA, "django-tasks-db's SQLite transaction helper"),
        "DatabaseBackendPruneTaskResultsTestCase.*": (
            NA, "django-tasks-db's prune command; delayq's workers prune (RESULT_RETENTION): "
                "test_worker.py::test_finished_results_are_pruned_after_the_retention"),
        "DatabaseWorkerProcessTestCase.*": (
            NA, "db_worker's processes and signals; delayq_worker's: test_processes.py"),
        "CompatTestCase.*": (NA, "django-tasks-db's compatibility module"),
        "DBTaskResultOrderingTestCase.*": _DB_MODEL,
        "AdminTestCase.*": (NA, "django-tasks-db's admin"),
    },
}


def verdict_for(module: str, cls: str, test: str) -> Verdict:
    table = VERDICTS.get(module, {})
    for key in (f"{cls}.{test}", f"{cls}.*", "*"):
        if key in table:
            return table[key]
    return (APPLIES, "")


def substitute_params(params: dict[str, Any]) -> tuple[type | None, dict[str, Any]]:
    """The delayq class that runs in place of ``params``' backend (None: the upstream one)."""
    from delayq_transport.django.tasks import DelayqBackend

    stand_ins: dict[str, type] = {DUMMY: AsDummy, IMMEDIATE: AsImmediate,
                                  DATABASE: DelayqBackend}
    cls = stand_ins.get(str(params.get("BACKEND")))
    if cls is None:
        return None, params
    return cls, params


# -- the database -----------------------------------------------------------------------------

def url_for(dbname: str) -> str:
    return make_conninfo(BASE_URL, dbname=dbname)


def sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement.encode())
        return cur.fetchall() if cur.description else []


def reset_tables(url: str) -> None:
    """Empty the harness' tables (its own database: nothing else is in it)."""
    sql(url, f'TRUNCATE "{MAIN_TABLE}", "{IMMEDIATE_TABLE}", "delayq_task_results"')


# -- the stand-ins --------------------------------------------------------------------------

class Runs:
    """Which tasks the harness let the worker run, and which finished (``task_finished``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._released: set[str] = set()
        self._finished: set[str] = set()

    def release(self, key: str) -> None:
        with self._cond:
            self._released.add(key)
            self._cond.notify_all()

    def wait_released(self, key: str) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: key in self._released, RUN_TIMEOUT_S)

    def finished(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        with self._cond:
            self._finished.add(str(task_result.id))
            self._cond.notify_all()

    def wait_finished(self, key: str) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: key in self._finished, RUN_TIMEOUT_S)


RUNS = Runs()
STATE: dict[str, str] = {}


def _backend_classes() -> tuple[type, type]:
    """AsDummy and AsImmediate (made once Django is set up: the backend imports django.tasks)."""
    from django.db import connections
    from django.tasks import Task, TaskResult

    from delayq_transport.django.tasks import DelayqBackend

    class AsDummyBackend(DelayqBackend):
        """Delayq's backend, plus the test helpers of Django's DummyBackend its tests call."""

        @property
        def results(self) -> list[TaskResult]:
            keys = sql(STATE["url"], f'SELECT "pKey" FROM "{self.table}" ORDER BY "id"')
            return [self.get_result(key) for (key,) in keys]

        def clear(self) -> None:
            reset_tables(STATE["url"])

    class AsImmediateBackend(DelayqBackend):
        """Delayq's backend whose enqueue returns once delayq's worker ran the task (inside
        ``atomic()``: at once, the worker runs it after the commit)."""

        def __init__(self, alias: str, params: dict[str, Any]) -> None:
            super().__init__(alias, params)
            self.table = IMMEDIATE_TABLE

        def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
            result = super().enqueue(task, args, kwargs)
            RUNS.release(result.id)
            if self.join_atomic and connections[self.database].in_atomic_block:
                return result
            if not RUNS.wait_finished(result.id):
                raise AssertionError(f"delayq's worker did not finish task {result.id} in "
                                     f"{RUN_TIMEOUT_S:.0f} s")
            return self.get_result(result.id)

    return AsDummyBackend, AsImmediateBackend


AsDummy: type
AsImmediate: type


def install_stand_ins() -> None:
    """Make Django's task_backends build delayq's stand-ins for the upstream backends."""
    global AsDummy, AsImmediate
    from django.tasks import task_backends

    AsDummy, AsImmediate = _backend_classes()
    handler = type(task_backends)
    original: Callable[[Any, str], Any] = handler.create_connection

    def create_connection(self: Any, alias: str) -> Any:
        cls, params = substitute_params(self.settings[alias])
        if cls is None:
            return original(self, alias)
        return cls(alias=alias, params=params)

    handler.create_connection = create_connection  # type: ignore[method-assign]


@dataclass
class RunningWorker:
    worker: Any
    thread: threading.Thread

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(60)


def start_worker() -> RunningWorker:
    """Delayq's worker for the Immediate's stand-in: one thread, held at each task until the
    enqueue that wrote it returned (its ``task_enqueued`` log comes first, as Django's)."""
    from django.tasks.signals import task_finished

    from delayq_transport.django.worker import Worker

    class HeldWorker(Worker):
        def execute(self, env: Any) -> None:
            RUNS.wait_released(env.key)
            super().execute(env)

    task_finished.connect(RUNS.finished, weak=False, dispatch_uid="delayq-upstream-runs")
    worker = HeldWorker(AsImmediate("upstream-immediate", {"QUEUES": []}), threads=1,
                        shutdown_timeout=10)
    thread = threading.Thread(target=worker.run, name="upstream-worker", daemon=True)
    thread.start()
    if not worker.ready.wait(60):
        raise RuntimeError("delayq's worker did not start")
    return RunningWorker(worker, thread)


# -- loading and running ----------------------------------------------------------------------

def link_packages(django_dir: Path | None, tasks_db_dir: Path | None) -> Path:
    """A directory on sys.path where the upstream tests are the packages their code imports:
    ``tasks`` (Django's: ``module_path`` is asserted as ``tasks.tasks.noop_task``) and
    ``tests`` (django-tasks-db's)."""
    root = Path(tempfile.mkdtemp(prefix="delayq-upstream-"))
    for name, source in (("tasks", django_dir), ("tests", tasks_db_dir)):
        if source is not None:
            (root / name).symlink_to(source.resolve(), target_is_directory=True)
    sys.path.insert(0, str(root))
    return root


def import_module(name: str, placeholders: list[str] | None) -> ModuleType:
    """Import an upstream module. With ``placeholders`` (django-tasks-db's tests, whose main
    branch may be ahead of the installed release), a helper it imports from
    ``django_tasks_db`` that the release lacks becomes a placeholder that raises if called:
    the tests that apply to delayq do not call them."""
    for _ in range(20):
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            found = re.match(r"cannot import name '(\w+)' from '(django_tasks_db[\w.]*)'",
                             str(exc))
            if found is None or placeholders is None:
                raise
            missing, owner = found.group(1), found.group(2)

            def placeholder(*args: Any, _name: str = missing, **kwargs: Any) -> Any:
                raise NotImplementedError(f"{_name}: not in the installed release")

            setattr(importlib.import_module(owner), missing, placeholder)
            placeholders.append(f"{owner}.{missing}")
    raise ImportError(f"{name}: too many missing names")


def tests_of(module: ModuleType) -> Iterator[unittest.TestCase]:
    def walk(suite: unittest.TestSuite | unittest.TestCase) -> Iterator[unittest.TestCase]:
        if isinstance(suite, unittest.TestCase):
            yield suite
        else:
            for item in suite:
                yield from walk(item)

    seen: set[str] = set()
    for test in walk(unittest.defaultTestLoader.loadTestsFromModule(module)):
        if type(test).__module__ == module.__name__ and test.id() not in seen:
            seen.add(test.id())
            yield test


@dataclass
class Outcome:
    module: str
    test: str
    verdict: str
    reason: str
    #: passed, failed, differs (a difference that still differs), unexpected-pass, skipped,
    #: n/a
    status: str
    detail: str = ""


class Recorder(unittest.TestResult):
    """Each test's problems by id (subtests' included), the harness' tables emptied before
    each test."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: dict[str, list[str]] = {}
        self.started: set[str] = set()
        self.skipped_ids: set[str] = set()

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        reset_tables(STATE["url"])
        self.started.add(test.id())

    def _problem(self, test: unittest.TestCase, err: Any) -> None:
        text = "".join(traceback.format_exception(*err)) if err else "?"
        self.problems.setdefault(test.id(), []).append(text)

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._problem(test, err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._problem(test, err)

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase,
                   err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._problem(test, err)

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self.skipped_ids.add(test.id())

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self.problems.setdefault(test.id(), []).append("unexpected success")


def run_module(name: str, placeholders: list[str] | None,
               wrap: Callable[[], Any] | None = None) -> list[Outcome]:
    """Run the module's tests that apply or differ, as one suite (so each class' set-up, its
    ``override_settings`` included, runs as under Django's runner)."""
    try:
        module = import_module(name, placeholders)
    except Exception:
        return [Outcome(name, "(import)", APPLIES, "", "failed", traceback.format_exc())]
    tests = list(tests_of(module))
    verdicts = {t.id(): verdict_for(name, type(t).__name__, t._testMethodName) for t in tests}
    suite = unittest.TestSuite(t for t in tests if verdicts[t.id()][0] != NA)
    recorder = Recorder()
    if wrap is None:
        suite.run(recorder)
    else:
        with wrap():
            suite.run(recorder)
    # An error outside any test (a class' set-up) is held under its own id.
    outside = [text for key, texts in recorder.problems.items()
               if key not in verdicts for text in texts]
    outcomes = []
    for test in tests:
        verdict, reason = verdicts[test.id()]
        label = f"{type(test).__name__}.{test._testMethodName}"
        if verdict == NA:
            outcomes.append(Outcome(name, label, verdict, reason, "n/a"))
            continue
        problems = recorder.problems.get(test.id(), [])
        if test.id() not in recorder.started:
            problems = ["did not run", *outside]
        detail = "\n".join(problems)
        if test.id() in recorder.skipped_ids and not problems:
            status = "skipped"
        elif verdict == DIFFERS:
            status = "differs" if problems else "unexpected-pass"
        else:
            status = "failed" if problems else "passed"
        outcomes.append(Outcome(name, label, verdict, reason, status, detail))
    return outcomes


def summary(module: str, outcomes: list[Outcome]) -> str:
    count = {s: sum(o.status == s for o in outcomes)
             for s in ("passed", "failed", "differs", "unexpected-pass", "skipped", "n/a")}
    ran = len(outcomes) - count["n/a"]
    line = (f"{module}: {len(outcomes)} tests, {ran} ran: {count['passed']} passed, "
            f"{count['failed']} failed, {count['differs']} differ as documented")
    if count["unexpected-pass"]:
        line += f", {count['unexpected-pass']} listed as differing PASSED (stale list)"
    if count["skipped"]:
        line += f", {count['skipped']} skipped by the test itself"
    return line + f"; {count['n/a']} not applicable"


def report(outcomes: list[Outcome], verbose: bool, out: Callable[[str], Any] = print) -> bool:
    modules = list(dict.fromkeys(o.module for o in outcomes))
    for module in modules:
        mine = [o for o in outcomes if o.module == module]
        out(summary(module, mine))
        for o in mine:
            if verbose or o.status in ("failed", "unexpected-pass"):
                out(f"  {o.status:15} {o.test}" + (f"  -- {o.reason}" if o.reason else ""))
            if o.status == "failed":
                out("    " + o.detail.strip().replace("\n", "\n    ")[-3000:])
            elif o.status == "differs" and verbose:  # how it differs: the assertion's line
                out("    " + o.detail.strip().splitlines()[-1][:300])
    return not any(o.status in ("failed", "unexpected-pass") for o in outcomes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--django", type=Path, help="Django's tests/tasks (fetched copy)")
    parser.add_argument("--tasks-db", type=Path, help="django-tasks-db's tests/ (fetched copy)")
    parser.add_argument("-v", "--verbose", action="store_true", help="every test's verdict")
    args = parser.parse_args(argv)
    if args.django is None and args.tasks_db is None:
        parser.error("give --django and/or --tasks-db")

    dbname = f"delayq_upstream_{uuid.uuid4().hex[:12]}"
    sql(BASE_URL, f'CREATE DATABASE "{dbname}"')
    url = STATE["url"] = url_for(dbname)
    worker: RunningWorker | None = None
    links: Path | None = None
    try:
        os.environ["DELAYQ_UPSTREAM_DATABASE_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = "upstream_settings"
        sys.path.insert(0, str(HERE))
        links = link_packages(args.django, args.tasks_db)
        import django
        from django.test.utils import override_settings, setup_test_environment

        from delayq_transport import Database, migrate

        django.setup()
        setup_test_environment()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        with Database(url) as db:
            for table in (MAIN_TABLE, IMMEDIATE_TABLE):
                migrate(db, table)
        install_stand_ins()
        worker = start_worker()
        outcomes: list[Outcome] = []
        placeholders: list[str] = []
        if args.django is not None:
            for path in sorted(args.django.glob("test_*.py")):
                outcomes += run_module(f"tasks.{path.stem}", None)
        if args.tasks_db is not None:
            # The tests' own settings name django-tasks-db's backend (delayq's stand-in here).
            own = {"default": {"BACKEND": DATABASE, "QUEUES": ["default", "queue-1"]}}
            from delayq_transport.django.tasks import DelayqBackend

            module = import_module("tests.tests", placeholders)
            if hasattr(module, "DatabaseBackend"):  # the signal sender they compare
                module.DatabaseBackend = DelayqBackend  # type: ignore[attr-defined]
            outcomes += run_module("tests.tests", placeholders,
                                   wrap=lambda: override_settings(TASKS=own))
        if placeholders:
            print("names django-tasks-db's tests import that its installed release lacks "
                  f"(placeholders): {', '.join(placeholders)}")
        ok = report(outcomes, args.verbose)
        return 0 if ok else 1
    finally:
        if worker is not None:
            worker.stop()
        from delayq_transport.django.backend import close_stores

        close_stores()
        from django.db import connections

        connections.close_all()
        sql(BASE_URL, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        if links is not None:
            shutil.rmtree(links)  # the links only: rmtree does not follow them


if __name__ == "__main__":
    sys.exit(main())
