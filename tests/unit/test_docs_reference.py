"""The reference pages cannot drift from the code.

docs/reference/*.md are rendered by docs/_gen/reference.py from the option registries, the
signatures and docstrings, click's command tree and the metrics registry; these tests fail
when a committed page differs from what the code renders (an option, parameter, command or
metric added, removed or changed without `python docs/_gen/reference.py`), and when the code
reads a setting that no registry declares, or declares one it never reads.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs/_gen/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.mark.parametrize("name", sorted(GEN.PAGES))
def test_committed_reference_page_is_what_the_code_renders(name: str) -> None:
    path = GEN.REFERENCE / name
    assert path.exists(), f"docs/reference/{name} missing: run python docs/_gen/reference.py"
    assert path.read_text() == GEN.PAGES[name](), (
        f"docs/reference/{name} differs from the code: run python docs/_gen/reference.py")


def test_no_reference_page_without_a_generator() -> None:
    generated = set(GEN.PAGES)
    hand_written = {"web-api.md"}  # checked by test_web_api_page_lists_every_json_route...
    pages = {p.name for p in GEN.REFERENCE.glob("*.md")}
    assert pages - generated - hand_written == set()


def test_an_undocumented_parameter_fails_the_render() -> None:
    def documented(a: int, b: int = 2) -> None:
        """Something.

        Parameters:
          a: the first.
        """

    with pytest.raises(GEN.DocError, match=r"not documented \['b'\]"):
        GEN.parameters(documented, documented, "documented")


def test_parameter_sections_parse_shared_and_continued_entries() -> None:
    def f(a: int, b: int, c: int) -> None:
        """Summary.

        Parameters:
          a, b: shared
            and continued.
          c: last.

        Not part of it.
        """

    assert GEN.param_docs(f) == {"a": "shared and continued.", "b": "shared and continued.",
                                 "c": "last."}


# -- settings the code reads, against the registries ------------------------------------


def _calls(root: Path) -> list[tuple[Path, ast.Call]]:
    return [(path, node) for path in sorted(root.glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)]


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        owner = func.value
        name = owner.id if isinstance(owner, ast.Name) else \
            owner.attr if isinstance(owner, ast.Attribute) else ""
        return f"{name}.{func.attr}"
    return ""


def _tuple_named(path: Path, name: str) -> set[str]:
    """String items of a module- or class-level ``name = (...)`` (or ``base + (...)``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found |= {c.value for c in ast.walk(node.value)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return found


def test_transport_reads_exactly_the_declared_options() -> None:
    from delayq_transport.transport.options import BACKEND_OPTIONS, TRANSPORT_OPTIONS

    root = ROOT / "delayq_transport/transport"
    read: dict[str, set[str]] = {}
    for path, call in _calls(root):
        callee, args = _callee(call), [_literal(a) for a in call.args]
        if callee in ("options.get", "opts.get") and args and args[0]:
            read.setdefault(args[0], set()).add(path.name)
        elif callee in ("opt",) and args and args[0]:
            read.setdefault(args[0], set()).add(path.name)
        elif callee in ("TRANSPORT_OPTIONS.read",) and len(args) > 1 and args[1]:
            read.setdefault(args[1], set()).add(path.name)
        elif callee == "TRANSPORT_OPTIONS.default" and args and args[0]:
            read.setdefault(args[0], set()).add(path.name)
    channel = _tuple_named(root / "channel.py", "from_transport_options")
    channel -= {"body_encoding", "deadletter_queue"}  # kombu's own, read by its virtual channel
    kombu_reads = {"polling_interval"}  # kombu's virtual Transport reads it from the options
    declared = set(TRANSPORT_OPTIONS)
    assert set(read) | channel | set(BACKEND_OPTIONS) <= declared, "read but not declared"
    assert declared <= set(read) | channel | kombu_reads, "declared but never read"
    in_backend = {name for name, files in read.items() if "backend.py" in files}
    assert in_backend <= set(BACKEND_OPTIONS), (
        "Backend reads options the transport never passes it (add them to BACKEND_OPTIONS)")


def test_beat_reads_exactly_the_declared_settings() -> None:
    from delayq_beat.conf import BEAT_SETTINGS, ENTRY_OPTIONS
    from delayq_beat.entries import DELAYQ_OPTIONS

    read: set[str] = set()
    named: set[str] = set()
    readers = ("setting", "seconds", "_conf", "conf.get", "BEAT_SETTINGS.read")
    for path in sorted((ROOT / "delayq_beat").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _callee(node) in readers:
                read |= {name for a in node.args
                         if (name := _literal(a)) and name.startswith("delayq_beat_")}
            if isinstance(node, ast.Attribute) and node.attr.startswith("delayq_beat_"):
                named.add(node.attr)  # app.conf.delayq_beat_x read as an attribute
    assert read | named <= set(BEAT_SETTINGS), "read but not declared"
    assert set(BEAT_SETTINGS) <= read, "declared but never read"
    assert set(ENTRY_OPTIONS) == set(DELAYQ_OPTIONS)


def test_django_backend_reads_exactly_the_declared_options() -> None:
    """The ``django.tasks`` backend reads its OPTIONS only through ``TASK_OPTIONS.parse``
    (``options["NAME"]`` of what it returns), every declared one, and none by ``.get``: a
    second reading path would skip the registry's checks and the reference."""
    import re

    from delayq_transport.django.options import TASK_OPTIONS

    root = ROOT / "delayq_transport/django"
    read: set[str] = set()
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id == "options" and (name := _literal(node.slice))):
                read.add(name)
            if isinstance(node, ast.Call) and _callee(node) in ("options.get",
                                                               "self.options.get"):
                raise AssertionError(f"{path.name} reads OPTIONS around TASK_OPTIONS.parse")
    assert read == set(TASK_OPTIONS)
    # The how-to's example names only declared options.
    text = (ROOT / "docs/how-to/django-tasks.md").read_text()
    example = text[text.index('"OPTIONS": {') + len('"OPTIONS": {'):]
    example = example[:example.index("},")]
    assert set(re.findall(r'^\s*"([A-Z_]+)":', example, re.M)) <= set(TASK_OPTIONS)


def test_web_api_page_lists_every_json_route_and_no_other() -> None:
    """docs/reference/web-api.md is written by hand; its table must name each `/api` route of
    `delayq web` (method and path) and nothing the server does not serve."""
    import re
    from types import SimpleNamespace

    from delayq_transport.web.app import create_app

    # The app is only built to read its routes: no request runs, so no database is needed.
    app = create_app(SimpleNamespace(db=None, queries=None, table="delayed_queue"))
    served = {(method, route.path) for route in app.routes if route.path.startswith("/api/")
              for method in getattr(route, "methods", ()) if method != "HEAD"}
    text = (ROOT / "docs/reference/web-api.md").read_text()
    documented = set(re.findall(r"\b(GET|POST|DELETE) (/api/[^\s`?]+)", text))

    def matches(doc_path: str, route_path: str) -> bool:
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(route_path))
        return re.fullmatch(pattern, doc_path) is not None

    undocumented = {(m, p) for m, p in served
                    if not any(dm == m and matches(dp, p) for dm, dp in documented)}
    unknown = {(m, p) for m, p in documented
               if not any(sm == m and matches(p, sp) for sm, sp in served)}
    assert undocumented == set(), "routes missing from docs/reference/web-api.md"
    assert unknown == set(), "documented but not served"


def test_connect_timeout_transport_option_wins_over_celerys() -> None:
    """``connect_timeout`` is declared, so it must act: set in the transport options it is
    what the pool gets; unset, Celery's ``broker_connection_timeout`` (kombu's) applies."""
    from kombu import Connection

    url = "delayq+postgresql://u@db.invalid/app"
    with Connection(url, connect_timeout=4, transport_options={"connect_timeout": 2}) as conn:
        assert conn.transport._backend_opts["connect_timeout"] == 2
    with Connection(url, connect_timeout=4) as conn:
        assert conn.transport._backend_opts["connect_timeout"] == 4.0


def test_the_cli_page_does_not_go_through_clicks_help_formatter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """click 8.5 added a `--help` row to every command's help table, and a fresh clone went red
    on cli.md: the page is rendered from each command's parameters, so click's formatting (help
    records, usage pieces, the formatter) is never called and a release that changes it cannot
    change the page."""
    import click

    def formatter_called(*args: object, **kwargs: object) -> None:
        raise AssertionError("cli.md rendered through click's help formatting")

    for owner, attr in ((click.Option, "get_help_record"), (click.Argument, "get_help_record"),
                        (click.Command, "collect_usage_pieces"), (click.Command, "format_help"),
                        (click.Command, "format_options"), (click.Parameter, "make_metavar")):
        monkeypatch.setattr(owner, attr, formatter_called)
    assert GEN.cli_page() == (GEN.REFERENCE / "cli.md").read_text()
