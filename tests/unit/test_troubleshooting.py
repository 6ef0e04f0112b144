"""docs/troubleshooting.md quotes real messages; these tests keep them real.

Every line of the page's ``text`` blocks is a message as printed. Each section names the
pieces of its messages that delayq writes (FRAGMENTS): every piece must be in that section's
quoted text *and* be literal text of a string in delayq_transport or delayq_beat (an f-string's
or a %-format's text between its fields, adjacent literals joined as Python joins them), and
every quoted line must contain one of its section's pieces. A message reworded in the code, or
a line added to the page without its piece, fails here. kombu's own message is produced by
running kombu.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCES = [ROOT / "delayq_transport", ROOT / "delayq_beat"]
TEXT_BLOCK = re.compile(r"^```text\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: printf-style fields of log messages: the text between them is what the code writes.
PRINTF_FIELD = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfi]")

#: Section heading -> the pieces of its quoted messages that delayq's code writes.
FRAGMENTS: dict[str, list[str]] = {
    "A publish inside `atomic()` is refused: another database": [
        "your transaction is on database ", ", and the broker is database ",
        ": a task written in your transaction would never reach the broker's workers, and one "
        "written by the broker would not commit or roll back with your data. Publish it outside "
        "the transaction, or keep the broker's table in your application's database",
        "Django: DELAYQ_DATABASE = ", " joins the atomic() blocks of DATABASES[",
        "]; set it to the alias of the broker's database, as CELERY_BROKER_URL = "
        "broker_url(DATABASES[alias]) names it, or set DELAYQ_JOIN_ATOMIC = False",
        "; nothing was published"],
    "Django settings refused at start": [
        "DELAYQ_DATABASE = ", " is not in DATABASES", "DATABASES entry ",
        ": delayq needs PostgreSQL (django.db.backends.postgresql)"],
    "Permission denied": [
        "permission denied on ", "; every delayq role needs SELECT on ",
        " to check the schema (see `delayq grants`)", "the schema of ",
        " is not current: missing migration(s) ", ". This role cannot apply them (",
        "); run `delayq migrate` as a role that may run DDL (the tables' owner), see "
        "`delayq grants` and docs/how-to/roles.md"],
    "LISTEN through a transaction pooler": [
        "delayq: ", "LISTEN cannot deliver through a transaction pooler: polling instead "
        "(give a direct listen_url for push wake-ups)", "LISTEN on ",
        " did not deliver a notification within ", " s (a transaction pooler?): polling instead"],
    "The database cannot be reached": ["database ", " unreachable: "],
    "No database, or not a PostgreSQL URL": [
        "no database: pass --database-url or set DELAYQ_DATABASE_URL", "invalid database URL ",
        ": expected postgresql://user@host:port/dbname (or delayq+postgresql://...)"],
    "An edit in the Django admin changes nothing": [
        "entry ", "changed in ", " after the import (", "interval start", "delayq beat: ",
        "import mode ignores edits in ", ": run `delayq beat import --from ",
        "` again to take them (or edit the entry with `delayq beat`)"],
}
#: Sections whose message is another library's, checked by running it.
PRODUCED = {"`KeyError: 'No such transport: delayq'`"}


@cache
def sections() -> dict[str, list[str]]:
    """Heading -> the lines of its ``text`` blocks."""
    out: dict[str, list[str]] = {}
    for part in re.split(r"^## ", PAGE.read_text(), flags=re.MULTILINE)[1:]:
        heading, _, body = part.partition("\n")
        out[heading.strip()] = [line for block in TEXT_BLOCK.findall(body)
                                for line in block.splitlines() if line.strip()]
    return out


def _pieces(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return PRINTF_FIELD.split(node.value)
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


@cache
def code_pieces() -> tuple[str, ...]:
    """Literal text of every string in the sources, cut at its fields."""
    found: list[str] = []
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                found += _pieces(node)
    return tuple(found)


def test_every_section_with_quoted_messages_is_checked() -> None:
    quoting = {h for h, lines in sections().items() if lines}
    assert quoting, "no ```text blocks found: the page's format changed?"
    assert quoting - set(FRAGMENTS) - PRODUCED == set(), "sections with unchecked messages"
    assert set(FRAGMENTS) | PRODUCED <= set(sections()), "FRAGMENTS name a section that is gone"


@pytest.mark.parametrize("heading", sorted(FRAGMENTS))
def test_quoted_messages_are_the_codes(heading: str) -> None:
    lines = sections()[heading]
    quoted = "\n".join(lines)
    pieces = code_pieces()
    for fragment in FRAGMENTS[heading]:
        assert fragment in quoted, f"{heading!r}: {fragment!r} is not quoted on the page"
        assert any(fragment in p for p in pieces), (
            f"{heading!r}: {fragment!r} is in no string of the code: reworded? Update the page")
    for line in lines:
        assert any(f in line for f in FRAGMENTS[heading]), (
            f"{heading!r}: the quoted line {line!r} contains none of the section's pieces")


def test_kombus_message_for_a_missing_import_is_as_quoted() -> None:
    """kombu without ``import delayq_transport``: its message, produced by kombu itself."""
    (heading,) = PRODUCED
    (quoted,) = sections()[heading]
    code = "import kombu; kombu.Connection('delayq+postgresql://app@db/app').transport"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and done.stderr.strip().splitlines()[-1] == quoted, done.stderr
