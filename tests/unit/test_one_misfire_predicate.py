"""Issue 49, item 4: the misfire predicate is written once, in the scheduling engine
(``scheduling.misfire.dropped``); the front ends' consumers (the kombu channel, Dramatiq's
consumer, the django.tasks worker) only call it, giving it how to read their header."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "delayq_transport"
FRONT_ENDS = ("transport", "dramatiq", "django")
#: What a front end may take from the engine's misfire module.
ALLOWED = {"dropped", "HEADER"}


def _misfire_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("scheduling.misfire"):
            out += [f"{path.relative_to(PKG)}:{node.lineno} {a.name}" for a in node.names
                    if a.name not in ALLOWED]
    return out


def test_front_ends_take_only_the_engines_predicate() -> None:
    found = [hit for part in FRONT_ENDS for f in sorted((PKG / part).rglob("*.py"))
             for hit in _misfire_imports(f)]
    assert found == [], "front ends judging misfires themselves:\n" + "\n".join(found)


def test_each_front_end_calls_it() -> None:
    callers = {part for part in FRONT_ENDS for f in (PKG / part).rglob("*.py")
               if "dropped" in {a.name for n in ast.walk(ast.parse(f.read_text()))
                                if isinstance(n, ast.ImportFrom)
                                and (n.module or "").endswith("scheduling.misfire")
                                for a in n.names}}
    assert callers == set(FRONT_ENDS)
