"""Render the page regions that show a captured failure, from docs/_captured/NAME.json.

A page shows a failure between two markers::

    <!-- captured: NAME by TEST (docs/_captured/NAME.json, rendered by ...: do not edit) -->
    ...
    <!-- /captured -->

and this script rewrites what lies between them from the capture, which the test named in it
made happen for real and checks on every run (tests/_captured.py). So the exception class, the
message, the exit status and the log line a page shows are what the code does.

    python docs/_gen/captured.py            # rewrite every region
    python docs/_gen/captured.py --check    # exit 1 when a region differs from its capture

``tests/unit/test_docs_captured.py`` runs the check.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CAPTURED = ROOT / "docs" / "_captured"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
REGION = re.compile(r"(<!-- captured: ([\w-]+)[^\n]*-->\n)(.*?)(<!-- /captured -->)", re.DOTALL)
OPENING = "<!-- captured: {name} by {test} (docs/_captured/{name}.json, rendered by " \
          "docs/_gen/captured.py: do not edit) -->\n"


def load(name: str) -> dict[str, Any]:
    path = CAPTURED / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"no capture docs/_captured/{name}.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def render(name: str) -> str:
    """The Markdown a region shows for capture ``name``."""
    c = load(name)
    parts: list[str] = []
    if "command" in c:
        lines = [f"$ {c['command']}", *c.get("output", "").splitlines()]
        if "exit_status" in c:
            lines += ["$ echo $?", str(c["exit_status"])]
        parts.append("```console\n" + "\n".join(lines) + "\n```")
    elif "output" in c:
        parts.append("```text\n" + c["output"] + "\n```")
    if "exception" in c:
        parts.append(f"```text\n{c['exception']}: {c['message']}\n```")
        caught = c.get("caught_as") or c["exception"]
        parts.append(f"The caller receives this exception: `except {caught}` catches it.")
    if "log" in c:
        parts.append("```text\n" + c["log"] + "\n```")
    if "process" in c and "exit_status" in c:
        parts.append(f"`{c['process']}` exits with status {c['exit_status']}.")
    return "\n\n".join(parts) + "\n"


def rendered(text: str) -> str:
    """``text`` with every captured region rendered again."""
    return REGION.sub(lambda m: OPENING.format(name=m.group(2), test=load(m.group(2))["test"])
                      + render(m.group(2)) + m.group(4), text)


def regions(text: str) -> list[str]:
    """The capture names a page shows, in order."""
    return [m.group(2) for m in REGION.finditer(text)]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for page in PAGES:
        text = page.read_text()
        new = rendered(text)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if not check:
                page.write_text(new)
    verb = "differ from their captures (run python docs/_gen/captured.py)" if check \
        else "rewritten"
    for page in stale:
        print(f"{page}: {verb}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
