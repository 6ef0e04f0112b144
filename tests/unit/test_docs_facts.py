"""What the pages state about the code, checked against the code.

* Every exception a page names in code (``TransactionRefused``) is one of delayq's: a bare name
  imports from ``delayq_transport`` (``except delayq_transport.X`` works), a dotted one
  (``delayq_transport.spark.ExecutorEnvironmentError``) from its module, and the code makes it
  (raises it, or an error translator returns it) or one of its subclasses. Exceptions of other
  libraries are named with their module, or are Python's own.
* The Django settings table of docs/how-to/django.md is exactly the ``DELAYQ_*`` settings the
  Django app reads, with the defaults it reads them with.
* move-from's schemes in docs/how-to/move-waiting-tasks.md are those it accepts.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

import delayq_transport
from delayq_transport.django import FrameworkMissing

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
SOURCES = sorted(p for root in ("delayq_transport", "delayq_beat")
                 for p in (ROOT / root).rglob("*.py"))
#: Modules that load only inside a Django project that installs them (Django models): they
#: define no exception.
APP_ONLY = ("delayq_transport/django/admin/",)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
#: A name in inline code, optionally with its module: ``X``, ``delayq_transport.spark.X``,
#: ``kombu.exceptions.X``, or the start of ``X: message``.
NAMED = re.compile(r"``?((?:[a-z_][\w]*\.)*[A-Z]\w*)(?::[^`]*)?``?")
#: Exceptions of other libraries the pages may name bare, and where they live.
FOREIGN = {"OperationalError": "kombu.exceptions"}


@cache
def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in delayq's source, by name."""
    found: dict[str, type[BaseException]] = {}
    for path in SOURCES:
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        names = [n.name for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.ClassDef)]
        if not names or str(path.relative_to(ROOT)).startswith(APP_ONLY):
            continue
        try:
            loaded = importlib.import_module(module)
        except FrameworkMissing:
            continue  # no django.tasks nor the django-tasks backport here (tests/djtasks)
        for name in names:
            obj = getattr(loaded, name, None)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                found[name] = obj
    return found


@cache
def made_in_code() -> frozenset[str]:
    """Names the code calls (``raise X(...)``, ``return X(...)`` of an error translator)."""
    called: set[str] = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called.add(func.id if isinstance(func, ast.Name) else
                           func.attr if isinstance(func, ast.Attribute) else "")
    return frozenset(called)


def named_exceptions(text: str) -> set[str]:
    """Exception names a page shows in inline code (prose and tables, not code blocks)."""
    ours = exception_classes()
    names = set()
    for dotted in NAMED.findall(FENCE.sub("", text)):
        name = dotted.rsplit(".", 1)[-1]
        if name in ours or name in FOREIGN or dotted.startswith(("delayq_transport.", "kombu.")) \
                and name.endswith(("Error", "Refused", "Missing", "Denied", "Unavailable")):
            names.add(dotted)
    return names


def problems(dotted: str) -> list[str]:
    module, _, name = dotted.rpartition(".")
    if not module:
        if isinstance(getattr(builtins, name, None), type):
            return []
        if name in FOREIGN:
            module = FOREIGN[name]
        else:
            module = "delayq_transport"
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return [f"`{dotted}` does not import from {module}"]
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        return [f"`{dotted}` is not an exception"]
    if not module.startswith("delayq_transport"):
        return []
    made = made_in_code()
    family = [n for n, cls in exception_classes().items() if issubclass(cls, obj)]
    if not any(n in made for n in family):
        return [f"`{dotted}`: the code never raises it nor a subclass"]
    return []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_exception_a_page_names_imports_and_is_raised(page: Path) -> None:
    found = [f"{page.relative_to(ROOT)}: {p}"
             for name in sorted(named_exceptions(page.read_text())) for p in problems(name)]
    assert found == [], "\n".join(found)


def test_the_exception_check_finds_names_and_rejects_what_is_wrong() -> None:
    text = ("`TransactionRefused`, `delayq_transport.SchemaMissing`, `PastEta`, "
            "`kombu.exceptions.OperationalError`, `DatabaseUnavailable: host x`, `KeyError`")
    assert named_exceptions(text) == {
        "TransactionRefused", "delayq_transport.SchemaMissing", "PastEta",
        "kombu.exceptions.OperationalError", "DatabaseUnavailable"}
    assert problems("TransactionRefused") == []
    assert problems("delayq_transport.spark.ExecutorEnvironmentError") == []
    assert problems("PastEta") == ["`PastEta` does not import from delayq_transport"]
    assert problems("delayq_transport.NoSuchError") != []
    assert problems("KeyError") == [] and problems("OperationalError") == []


# -- Django settings ----------------------------------------------------------------------


def settings_the_code_reads() -> dict[str, set[object]]:
    """``getattr(settings, "DELAYQ_X", default)`` in the Django app: name -> every default a
    read of it gives (one, unless two modules disagree)."""
    read: dict[str, set[object]] = {}
    for path in sorted((ROOT / "delayq_transport/django").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "getattr" and len(node.args) == 3
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "settings"
                    and isinstance(node.args[1], ast.Constant)
                    and str(node.args[1].value).startswith("DELAYQ_")):
                read.setdefault(str(node.args[1].value), set()).add(
                    ast.literal_eval(node.args[2]))
    return read


def test_the_django_settings_table_is_what_the_app_reads() -> None:
    text = (ROOT / "docs/how-to/django.md").read_text()
    rows = dict(re.findall(r"^\| `(DELAYQ_\w+)` \| `([^`]*)` \|", text, re.MULTILINE))
    read = settings_the_code_reads()
    assert read, "the Django app reads no DELAYQ_ setting: has it moved?"
    assert {k: {ast.literal_eval(v)} for k, v in rows.items()} == read


# -- move-from's schemes ------------------------------------------------------------------


def test_move_from_schemes_on_the_page_are_the_accepted_ones() -> None:
    from delayq_transport.move.cli import SCHEMES

    text = " ".join((ROOT / "docs/how-to/move-waiting-tasks.md").read_text().split())
    sentence = re.search(r"The source is a Redis or RabbitMQ broker:\*\* (.*?)\. Any other",
                         text)
    assert sentence is not None
    assert set(re.findall(r"`(\w+)://`", sentence.group(1))) == set(SCHEMES)


def test_the_root_package_exports_every_core_exception() -> None:
    from delayq_transport.core.db import errors

    defined = {n for n, v in vars(errors).items()
               if isinstance(v, type) and issubclass(v, BaseException)
               and v.__module__ == errors.__name__}
    assert defined <= set(delayq_transport.__all__)


# -- pages the code and the pages cite ---------------------------------------------------


def test_every_markdown_file_cited_is_in_the_repository() -> None:
    """A page, docstring, comment or SQL block that names a ``.md`` file names one of this
    repository (the design notes it once cited lived elsewhere: docs/explanation/design.md)."""
    ours = {p.name for p in ROOT.rglob("*.md") if ".git" not in p.parts}
    cited = re.compile(r"(?<![\w/.-])(?:[\w.-]+/)*([\w-]+\.md)\b")
    scanned = [*PAGES, *SOURCES, *(ROOT / "delayq_transport/core").rglob("*.sql"),
               *(p for p in (ROOT / "tests").rglob("*.py") if not p.name.startswith("test_docs")),
               *(ROOT / "bench").rglob("*.py"), *(ROOT / "scripts").iterdir()]
    missing = sorted({f"{path.relative_to(ROOT)}: {name}" for path in scanned if path.is_file()
                      for name in cited.findall(path.read_text(errors="replace"))
                      if name not in ours})
    assert missing == [], "\n".join(missing)


# -- intervals the explanation pages quote -------------------------------------------------


def test_quoted_counts_are_the_codes() -> None:
    """The wake-up's listing limits the pages quote (1,000 due times, 100,000 kept)."""
    from delayq_transport.core.queue.announce import MAX_LISTED
    from delayq_transport.core.queue.watermark import MAX_ANNOUNCED
    for page in ("docs/explanation/wakeups.md",):
        assert f"{MAX_LISTED:,}" in (ROOT / page).read_text(), page
    wakeups = (ROOT / "docs/explanation/wakeups.md").read_text()
    assert f"{MAX_ANNOUNCED:,}\nannounced times" in wakeups or \
        f"{MAX_ANNOUNCED:,} announced times" in wakeups


@pytest.mark.parametrize("page,sentence,value", [
    ("docs/explanation/delivery.md", r"by the Dramatiq broker every (\d+) ms",
     "delayq_transport.core.queue.session:ACK_FLUSH_INTERVAL_S"),
    ("docs/explanation/wakeups.md", r"at most one commit per\s+(\d+) ms window",
     "delayq_transport.core.queue.announce:DEFAULT_WINDOW_S"),
    ("docs/how-to/transactions.md", r"carry a notification at most once per\s+(\d+) ms",
     "delayq_transport.core.queue.announce:DEFAULT_WINDOW_S"),
])
def test_quoted_intervals_are_the_codes(page: str, sentence: str, value: str) -> None:
    match = re.search(sentence, (ROOT / page).read_text())
    assert match is not None, f"{page}: no sentence {sentence!r}"
    module, name = value.split(":")
    assert int(match.group(1)) == round(getattr(importlib.import_module(module), name) * 1000)


def test_the_crash_window_of_a_publish_is_stated_once() -> None:
    """What a PostgreSQL crash can lose of non-durable publishes (~0.6 s: 3 × the default
    ``wal_writer_delay``) is explanation/delivery.md's; option texts and other pages link to it."""
    window = re.compile(r"0\.6 s")
    found = [str(p.relative_to(ROOT)) for p in PAGES for _ in window.findall(p.read_text())]
    assert found == ["docs/explanation/delivery.md"], found
    assert "3 × `wal_writer_delay`" in (ROOT / "docs/explanation/delivery.md").read_text()


@pytest.mark.parametrize("sentence,name", [
    (r"keeps at most\s+(\d+) ms of the rate", "BURST_MS"),
    (r"is tried again\s+(\d+) ms later", "RETRY_MS"),
    (r"among the first\s+(\d+) due tasks", "KEY_WINDOW"),
])
def test_limits_page_quotes_the_controls_constants(sentence: str, name: str) -> None:
    """docs/how-to/limits.md's figures are core/queue/controls.py's."""
    from delayq_transport.core.queue import controls
    match = re.search(sentence, (ROOT / "docs/how-to/limits.md").read_text())
    assert match is not None, f"limits.md: no sentence {sentence!r}"
    assert int(match.group(1)) == getattr(controls, name)
