"""The package layout's rules, checked on the source: the core imports no adapter, adapters
contain no SQL (they call the core) and import only the core's published names, every package
imports only the layers below it (no adapter imports another; the scheduling engine knows
neither Celery nor Dramatiq, nor Celery beat's names), the core's parts stand on one another in
one order, and no import circle anywhere. Plus every public import path users type.

Read as text and ASTs (nothing is imported for the rules), so a violation fails here with
the file and line, before any behaviour test notices.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "delayq_transport"
CORE = PKG / "core"
#: Everything that is not the core: folders of delayq_transport, and delayq_beat.
ADAPTER_ROOTS = [p for p in PKG.iterdir() if p.is_dir() and p.name not in ("core", "__pycache__")]
ADAPTER_ROOTS.append(ROOT / "delayq_beat")
ADAPTER_NAMES = {p.name for p in ADAPTER_ROOTS if p.parent == PKG}

#: The shapes of SQL statements a string literal would hold if an adapter built one.
_SQL_SHAPE = (
    r"\b(SELECT\s.+\sFROM|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|CREATE\s+(TABLE|INDEX|"
    r"ROLE|FUNCTION|TRIGGER)|ALTER\s+(TABLE|ROLE)|DROP\s+(TABLE|INDEX)|TRUNCATE\s+\S|"
    r"GRANT\s+\S+.+\sON\s|COPY\s+\S+\s+(FROM|TO)\s)")
#: In capitals, as every statement of the core's .sql files writes them, a shape is SQL by
#: itself.
SQL_CAPITALS_RE = re.compile(_SQL_SHAPE, re.DOTALL)
#: In any case, a shape is SQL when the text also holds what only SQL writes: a placeholder,
#: a quoted identifier, ``*``, ``=``, ``;``, ``VALUES (``, ``RETURNING`` or ``LIMIT n``; prose
#: ("select the queue from the list") has none of them.
SQL_ANY_CASE_RE = re.compile(_SQL_SHAPE, re.DOTALL | re.IGNORECASE)
SQL_MARK_RE = re.compile(r'%\(\w+\)[sb]|%s|\$\d|"\w+"|\*|=|;|\bvalues\s*\(|\breturning\b|'
                         r"\blimit\s+\d", re.IGNORECASE)


def looks_like_sql(text: str) -> bool:
    """Whether a string literal holds (part of) an SQL statement."""
    return bool(SQL_CAPITALS_RE.search(text)
                or (SQL_ANY_CASE_RE.search(text) and SQL_MARK_RE.search(text)))


#: Ways into the database below the core's API.
FORBIDDEN_IMPORTS = ("psycopg.sql", "sqlalchemy", "delayq_transport.core.db.queries")
FORBIDDEN_CALLS = re.compile(r"\.(queries|q)\[|\bQueries\(|\.db\.(execute|fetchall|fetchone|run)\(")
#: Methods that send a statement (DB-API, psycopg, libpq): never given a string an adapter
#: built (an f-string, a concatenation, ``%`` or ``.format``/``.join``, or a name bound to one).
EXECUTING = {"execute", "executemany", "exec_", "exec_params", "mogrify", "copy", "copy_expert",
             "copy_from", "copy_to"}


def _built_string(node: ast.AST, built_names: set[str]) -> bool:
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("format", "join", "replace"):
        return True
    return isinstance(node, ast.Name) and node.id in built_names


def executes_built_strings(tree: ast.AST) -> list[int]:
    """Lines where a statement-sending method is called with a string built in the code."""
    built_names = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and _built_string(n.value, set())
                   for t in n.targets if isinstance(t, ast.Name)}
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in EXECUTING and n.args
            and _built_string(n.args[0], built_names)]


def _py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _adapter_files() -> list[Path]:
    files = [f for root in ADAPTER_ROOTS for f in _py_files(root)]
    assert len(files) > 10, "adapter files not found: the layout moved?"
    return files


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, relative ones resolved."""
    package = _module_of(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else _module_of(path).removesuffix(".__init__")
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            out += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


#: Layers from the bottom: a package imports its own modules and lower layers only.
LAYERS: dict[str, int] = {
    "core": 0,          # the queue core: SQL, the database
    "root": 1,          # delayq_transport/__init__.py: the core's API, kombu's alias
    "formats": 2,       # how Celery and Dramatiq messages sit in rows (kombu's JSON at most)
    "scheduling": 3,    # the scheduling engine under Celery beat and Dramatiq's periodic actors
    "output": 2,        # how commands print: tables whole off a terminal, --json (no delayq)
    "browse": 4,        # the operator service under both operator front ends (CLI, web page)
    "commands": 4,      # the registry the command modules of every package join
    **dict.fromkeys(("transport", "dramatiq", "delayq_beat", "spark", "web", "metrics",
                    "django", "move"), 5),
    "cli": 6,           # the composition root: it loads the adapters' commands
}
#: The adapters: none imports another (same layer).
ADAPTERS = {name for name, level in LAYERS.items() if level == 5}
#: Third-party packages the engine must not import.
FRAMEWORKS = ("celery", "kombu", "dramatiq")


def _part(module: str) -> str:
    """The layout part a module belongs to (``delayq_transport.web.app`` -> ``web``)."""
    parts = module.split(".")
    if parts[0] == "delayq_beat":
        return "delayq_beat"
    if len(parts) == 1:
        return "root"
    return "cli" if parts[1] == "__main__" else parts[1]


def _our_modules() -> dict[str, Path]:
    files = _py_files(PKG) + _py_files(ROOT / "delayq_beat")
    return {_module_of(f).removesuffix(".__init__"): f for f in files}


def _import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: line}. Every import counts: module level, inside a
    function (lazy), and under ``if TYPE_CHECKING`` (a type-only back reference still means
    the lower module is written against the higher one). ``from pkg import name`` imports
    ``pkg.name`` when that is a module, else ``pkg``; a submodule's implicit import of its
    parent package is not counted (every submodule would depend on its package)."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parent = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{parent}.{base}" if base else parent
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                         for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.setdefault(name, node.lineno)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    modules = _our_modules()
    graph = _import_graph(modules)
    cycles = _cycles(graph)
    described = [" <-> ".join(c) + "\n    " + "; ".join(
        f"{a.rsplit('.', 1)[-1]} -> {b.rsplit('.', 1)[-1]} (line {graph[a][b]})"
        for a in c for b in c if b in graph[a]) for c in cycles]
    assert cycles == [], "import circles (cut them: move the shared piece down, or pass what " \
                         "is needed):\n" + "\n".join(described)


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def _layer_violations(modules: dict[str, Path]) -> list[str]:
    bad = []
    for module, edges in _import_graph(modules).items():
        source = _part(module)
        for target_module, line in edges.items():
            target = _part(target_module)
            if target == source:
                continue
            if source not in LAYERS or target not in LAYERS:
                bad.append(f"{module}: unknown layout part {source!r} or {target!r} "
                           "(add it to LAYERS)")
            elif LAYERS[target] >= LAYERS[source]:
                bad.append(f"{_where(modules[module])}:{line} ({source}) imports "
                           f"{target_module} ({target})")
    return bad


def test_packages_import_only_lower_layers_and_no_adapter_imports_another() -> None:
    bad = _layer_violations(_our_modules())
    assert bad == [], "imports against the layers (see LAYERS):\n" + "\n".join(bad)


def test_the_scheduling_engine_knows_no_framework_and_no_front_end() -> None:
    bad = [f"{f.relative_to(ROOT)}:{line} imports {mod}"
           for f in _py_files(PKG / "scheduling") for line, mod in _imports(f)
           if mod.split(".")[0] in FRAMEWORKS or mod.split(".")[0] == "delayq_beat"
           or (mod.startswith("delayq_transport.") and _part(mod) not in ("core", "scheduling"))]
    assert bad == [], "the engine imports only the core:\n" + "\n".join(bad)


def test_the_graph_rules_catch_a_cycle_and_a_cross_adapter_import(tmp_path: Path) -> None:
    """Not vacuous: a TYPE_CHECKING-only circle and one adapter importing another are found."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from delayq_transport.web.b import X\n")
    b.write_text("def f():\n    from delayq_transport.web.a import Y\n")
    modules = {"delayq_transport.web.a": a, "delayq_transport.web.b": b}
    assert _cycles(_import_graph(modules)) == [sorted(modules)]
    c = tmp_path / "c.py"
    c.write_text("from delayq_transport.transport import message\n")
    found = _layer_violations({"delayq_transport.spark.c": c,
                               "delayq_transport.transport.message": b})
    assert any("imports delayq_transport.transport.message (transport)" in v for v in found)


def test_lazy_commands_name_modules_that_exist() -> None:
    """``cli/main.py`` loads plugin commands by module name: each must exist."""
    from importlib.util import find_spec

    from delayq_transport.cli.main import LAZY_COMMANDS, STATUS_PLUGIN_MODULES

    names = {m for mods in LAZY_COMMANDS.values() for m in mods} | set(STATUS_PLUGIN_MODULES)
    assert [n for n in sorted(names) if find_spec(n) is None] == []


def test_core_imports_no_adapter() -> None:
    forbidden = tuple(f"delayq_transport.{n}" for n in ADAPTER_NAMES) + ("delayq_beat",
                                                                          "kombu", "celery")
    bad = [f"{f.relative_to(ROOT)}:{line} imports {mod}"
           for f in _py_files(CORE) for line, mod in _imports(f)
           if mod.startswith(forbidden)]
    assert bad == [], "the core must not import adapters (or Celery/kombu):\n" + "\n".join(bad)


def test_adapters_contain_no_sql() -> None:
    bad = []
    for f in _adapter_files():
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and looks_like_sql(node.value) and not _is_docstring(tree, node):
                bad.append(f"{f.relative_to(ROOT)}:{node.lineno} SQL literal {node.value[:60]!r}")
        bad += [f"{f.relative_to(ROOT)}:{line} sends a statement it built"
                for line in executes_built_strings(tree)]
        for line, mod in _imports(f):
            if mod.startswith(FORBIDDEN_IMPORTS):
                bad.append(f"{f.relative_to(ROOT)}:{line} imports {mod}")
        for no, text in enumerate(f.read_text().splitlines(), 1):
            if FORBIDDEN_CALLS.search(text):
                bad.append(f"{f.relative_to(ROOT)}:{no} runs a statement itself: {text.strip()}")
    assert bad == [], "adapters must call the core's API, not send SQL:\n" + "\n".join(bad)


def _is_docstring(tree: ast.AST, const: ast.Constant) -> bool:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and body[0].value is const:
            return True
    return False


def test_the_rules_catch_a_violation(tmp_path: Path) -> None:
    """The checks are not vacuous: a literal (capitals or not), an import, a direct call and
    a statement built in the code are each caught."""
    assert looks_like_sql("SELECT 1 FROM t") and looks_like_sql('INSERT INTO "x" VALUES (1)')
    assert looks_like_sql('select "id" from t where "pKey" = %(key)s')
    assert looks_like_sql("delete from t where id = %s") and looks_like_sql("select * from ")
    assert looks_like_sql('update t set "payload" = $1')
    assert looks_like_sql("insert into t values (1)")
    assert not looks_like_sql("select the queue from the list")  # prose passes
    assert not looks_like_sql("delete from the queue what you no longer need")
    built = ast.parse('cur.execute(f"select * from {t}")\n'
                      'q = "select %s" % x\nconn.execute(q)\n'
                      'conn.execute("SELECT " + cols)\nc.executemany(text.format(t=t), rows)\n'
                      'pipe.execute()\nconn.execute(statement, params)\n')
    assert executes_built_strings(built) == [1, 3, 4, 5]
    assert FORBIDDEN_CALLS.search('rows = queue.db.fetchall(q["x"])')
    f = tmp_path / "m.py"
    f.write_text("from ..core.queries import Queries\n")
    assert any(m.endswith("core.queries.Queries") for _, m in _imports_as(f, "delayq_transport"
                                                                           ".transport.m"))


def _imports_as(path: Path, module: str) -> list[tuple[int, str]]:
    package = module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = package.split(".")
            parent = ".".join(parts[: len(parts) - node.level + 1])
            out += [(node.lineno, f"{parent}.{node.module}.{a.name}") for a in node.names]
    return out


def test_every_sql_statement_lives_in_the_parts_sql_files() -> None:
    """SQL files only inside the core's parts, none elsewhere, and the core's Python modules hold
    no statement text either (DDL comes from SQLAlchemy Core, statements from the .sql files)."""
    sql_files = [p.relative_to(CORE).as_posix() for p in PKG.rglob("*.sql")
                 if p.is_relative_to(CORE)]
    assert sorted(p.relative_to(ROOT).as_posix() for p in PKG.rglob("*.sql")) == \
        sorted(f"delayq_transport/core/{f}" for f in sql_files)
    assert {f.split("/")[0] for f in sql_files if "/" in f} == set(CORE_PARTS)
    assert [f for f in sql_files if "/" not in f] == [], "a .sql file outside the parts"
    bad = []
    for f in _py_files(CORE):
        tree = ast.parse(f.read_text(), str(f))
        bad += [f"{f.name}:{n.lineno}" for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and looks_like_sql(n.value) and not _is_docstring(tree, n)]
    assert bad == [], bad


# -- the core's parts and what they publish ------------------------------------------------

#: The core's parts, from the bottom: each imports only the parts before it at a lower level
#: (inspect and ledgers sit side by side and import neither each other).
CORE_PARTS: dict[str, int] = {"db": 0, "schema": 1, "queue": 2, "inspect": 3, "ledgers": 3,
                              "integrations": 4}


def _core_part(module: str) -> str | None:
    """``delayq_transport.core.queue.session`` -> ``queue``; the core package itself: None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["delayq_transport", "core"] else None


def _published(package_init: Path) -> set[str]:
    """The ``__all__`` of a package, read from its source."""
    for node in ast.parse(package_init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def test_the_core_is_its_parts_each_on_the_ones_below() -> None:
    assert sorted(p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__") \
        == sorted(CORE_PARTS)
    assert [p.name for p in CORE.glob("*.py")] == ["__init__.py"], "a module outside the parts"
    modules = {m: p for m, p in _our_modules().items() if _core_part(m)}
    bad = [f"{_where(modules[m])}:{line} ({_core_part(m)}) imports {target}"
           for m, edges in _import_graph(modules).items() for target, line in edges.items()
           if _core_part(target) != _core_part(m)
           and CORE_PARTS[str(_core_part(target))] >= CORE_PARTS[str(_core_part(m))]]
    assert bad == [], "a part imports one at its level or above (see CORE_PARTS):\n" + \
        "\n".join(bad)


def published_api_violations(path: Path, module: str) -> list[str]:
    """Imports of the core in ``path`` (as ``module``) that reach past its published names:
    a module inside a part, or a name not in the ``__all__`` of the core or of a part."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    allowed = {"delayq_transport.core": _published(CORE / "__init__.py")}
    allowed |= {f"delayq_transport.core.{p}": _published(CORE / p / "__init__.py")
                for p in CORE_PARTS}
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bad += [f"{node.lineno}: import {a.name}" for a in node.names
                    if a.name.startswith("delayq_transport.core.") and a.name not in allowed]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            if base == "delayq_transport":
                names = {a.name for a in node.names}
                if "core" in names:
                    continue  # the core package itself: its attributes are what it publishes
            if not (base == "delayq_transport.core" or base.startswith("delayq_transport.core.")):
                continue
            if base not in allowed:
                bad.append(f"{node.lineno}: from {base} import ... (a module inside a part)")
                continue
            bad += [f"{node.lineno}: {a.name} is not in {base}.__all__" for a in node.names
                    if a.name not in allowed[base]]
    return bad


def test_adapters_import_only_the_cores_published_names() -> None:
    """Adapters see the core through ``delayq_transport.core`` and each part's ``__all__``:
    what a part keeps inside its modules can change without an adapter noticing."""
    bad = [f"{f.relative_to(ROOT)}:{v}" for f in _adapter_files()
           for v in published_api_violations(f, _module_of(f))]
    assert bad == [], "import the core's published API (add the name to the part's " \
                      "__all__ if an adapter needs it):\n" + "\n".join(bad)


def test_the_published_api_rule_catches_a_private_import(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from ..core.queue.session import Session\n"
                 "from ..core.queue import Session, SKEW_RETRY_S\n"
                 "from delayq_transport.core import DelayedQueue, announce\n"
                 "import delayq_transport.core.queue.leases\n"
                 "from ..core import queue\n")
    found = published_api_violations(f, "delayq_transport.transport.m")
    assert [v.split(":")[0] for v in found] == ["1", "2", "3", "4", "5"], found


def test_the_scheduling_engine_carries_no_celery_beat_names() -> None:
    """The engine serves Celery beat and Dramatiq's periodic actors alike: its loggers are its
    own modules', and no constant or table of it is named after Celery beat."""
    bad = []
    for f in _py_files(PKG / "scheduling"):
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger" \
                    and not (node.args and isinstance(node.args[0], ast.Name)
                             and node.args[0].id == "__name__"):
                bad.append(f"{f.name}:{node.lineno} a logger not named after its module")
            if isinstance(node, (ast.Name, ast.FunctionDef, ast.ClassDef)) and "BEAT" in \
                    getattr(node, "id", getattr(node, "name", "")):
                bad.append(f"{f.name}:{node.lineno} {getattr(node, 'id', '')}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.search(r"delayq_beat_(entries|installed)|^delayq beat:", node.value):
                bad.append(f"{f.name}:{node.lineno} {node.value[:60]!r}")
    assert bad == [], "\n".join(bad)


PUBLIC = [
    ("delayq_transport", ["DelayedQueue", "CronService", "CronMessage", "CronHandle",
                          "DailySchedule", "Database", "Envelope", "Offer", "OfferOutcome",
                          "StoredMessage", "KindStatus", "RetryPolicy", "config_hash", "migrate",
                          "DelayqError", "InvalidInput", "DatabaseUnavailable", "DatabaseError",
                          "SchemaMissing", "transaction", "TransactionRefused"]),
    ("delayq_transport.transport", ["Transport"]),
    ("delayq_transport.django", ["broker_url", "database_url"]),
    ("delayq_transport.formats.celery", ["kind_for", "queue_of_kind"]),
    ("delayq_transport.cli", ["main"]),
    ("delayq_beat", ["Scheduler", "BeatStore", "drop_misfired"]),
]


@pytest.mark.parametrize(("module", "names"), PUBLIC, ids=[m for m, _ in PUBLIC])
def test_public_import_paths(module: str, names: list[str]) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert missing == []


def test_spark_paths_resolve_lazily() -> None:
    """``from delayq_transport.spark import ...`` works, and ``delayq`` never imports pyspark
    on start (the spark-report command imports it when it runs)."""
    code = ("import sys, delayq_transport.cli; assert 'pyspark' not in sys.modules, 'pyspark'; "
            "from delayq_transport.spark import schedule_tasks, queue_dataframe; "
            "assert 'pyspark' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_broker_url_alias_and_beat_scheduler_entry_point() -> None:
    code = ("import delayq_transport; from kombu import Connection; "
            "c = Connection('delayq+postgresql://u@h/db'); "
            "assert c.transport_cls == 'delayq', c.transport_cls; "
            "from kombu.transport import resolve_transport; "
            "mod = resolve_transport('delayq').__module__; "
            "assert mod == 'delayq_transport.transport.kombu_transport', mod; "
            "from celery.beat import Scheduler; from importlib.metadata import entry_points; "
            "[ep] = entry_points(group='celery.beat_schedulers', name='delayq'); "
            "assert ep.load().__name__ == 'Scheduler'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_delayq_command_is_registered() -> None:
    from click import Context
    from click.testing import CliRunner

    from delayq_transport.cli import main

    assert {"migrate", "status", "demo", "beat", "spark-report", "web", "tasks", "grants",
            "metrics"} <= set(main.list_commands(Context(main)))
    result = CliRunner().invoke(main, ["beat", "--help"])
    assert result.exit_code == 0 and "list" in result.output
