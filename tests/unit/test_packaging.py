"""Every third-party module the package imports is declared in pyproject.toml, in the extra of
the part that imports it; what every install imports at start (the core, the transport, the
CLI's command modules) needs no extra. ``scripts/check-packaging`` checks the same at run time
in fresh venvs; this catches it before a wheel is built. The LICENSE matches pyproject."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: Folders whose modules may import an extra's packages at module level, and that extra.
EXTRA_OF_FOLDER = {"web": "web", "spark": "spark", "dramatiq": "dramatiq", "django": "django"}
#: Modules of those folders that every install imports (``delayq --help`` lists their commands,
#: the CLI decodes rows with them): base dependencies only at module level.
LOADED_BY_EVERY_INSTALL = {"web/cli.py", "web/__init__.py", "spark/cli.py", "spark/__init__.py",
                           "dramatiq/__init__.py", "formats/dramatiq.py", "dramatiq/ledger.py"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared(extra: str | None) -> set[str]:
    base = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    if extra is None:
        return base
    return base | {_name(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """Third-party top-level modules imported at module level, and anywhere."""
    module_level: set[str] = set()
    anywhere: set[str] = set()
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}  # `if TYPE_CHECKING:` and try/except ImportError: not here
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            if root in sys.stdlib_module_names or root in ("delayq_transport", "delayq_beat"):
                continue
            anywhere.add(root)
            if id(node) in top:
                module_level.add(root)
    return module_level, anywhere


@cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distribution(module: str) -> str:
    found = _distributions().get(module)
    assert found, f"no installed distribution provides {module!r}"
    return found[0].lower().replace("_", "-")


def test_every_import_is_declared_in_the_extra_of_its_part() -> None:
    problems = []
    all_declared = set().union(*(_declared(e) for e in PYPROJECT["project"][
        "optional-dependencies"] if e != "dev"), _declared(None))
    for path in sorted([*ROOT.joinpath("delayq_transport").rglob("*.py"),
                        *ROOT.joinpath("delayq_beat").rglob("*.py")]):
        rel = path.relative_to(ROOT / path.relative_to(ROOT).parts[0]).as_posix()
        folder = rel.split("/")[0]
        extra = None if rel in LOADED_BY_EVERY_INSTALL else EXTRA_OF_FOLDER.get(folder)
        module_level, anywhere = _imports(path)
        for module in sorted(anywhere):
            if _distribution(module) not in all_declared:
                problems.append(f"{rel}: {module} is in no extra of pyproject.toml")
        for module in sorted(module_level):
            if _distribution(module) not in _declared(extra):
                problems.append(f"{rel}: imports {module} at module level, which "
                                f"{'a base install' if extra is None else f'[{extra}]'} lacks")
    assert problems == []


def test_license_file_matches_pyproject() -> None:
    assert PYPROJECT["project"]["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "END OF TERMS AND CONDITIONS" in text
