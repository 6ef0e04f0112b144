"""Every ``manage.py delayq_worker ...`` line the pages show parses with the command's own
parser (as tests/unit/test_docs_commands.py does for ``delayq`` and ``celery`` lines; the
command needs Django's task framework, so the check lives here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from delayq_transport.django.management.commands.delayq_worker import Command

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINE = re.compile(r"manage\.py delayq_worker((?: +--?[\w-]+(?: +[^\s`|#-][^\s`|#]*)?)*)")


def worker_lines() -> list[tuple[Path, int, str]]:
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            found += [(page, number, m.group(1).strip()) for m in LINE.finditer(line)]
    return found


LINES = worker_lines()


def problem(args: str) -> str | None:
    parser = Command().create_parser("manage.py", "delayq_worker")
    try:
        parser.parse_args(shlex.split(args, comments=True))
    except CommandError as exc:
        return str(exc)
    return None


def test_the_pages_show_worker_lines() -> None:
    assert len(LINES) >= 5 and any("--processes" in args for _, _, args in LINES)


@pytest.mark.parametrize(("page", "number", "args"), LINES,
                         ids=[f"{p.relative_to(ROOT)}:{n}" for p, n, _ in LINES])
def test_every_worker_line_parses(page: Path, number: int, args: str) -> None:
    assert problem(args) is None, f"{page.relative_to(ROOT)}:{number}: {args}"


def test_a_wrong_line_is_reported() -> None:
    assert problem("--no-such-option") and problem("--threads") and problem("--threads x")
