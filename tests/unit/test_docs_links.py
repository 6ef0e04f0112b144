"""Every page's links resolve and every revision it cites exists.

Checked on README.md and docs/**/*.md: a relative link names a file of the repository, an
``#anchor`` names a heading (GitHub's slug) or an ``<a id>`` of its page, and every git
revision cited outside code blocks is a commit of this history. The code's own pointers into
docs/ (docstrings, help texts, error messages) must name pages that exist.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
#: A revision as pages cite it: 7-40 hex digits, at least one letter and one digit, not part of
#: a longer word, path or uuid.
REVISION = re.compile(r"(?<![\w./#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


def _prose(text: str) -> str:
    """The page without fenced code blocks (links and revisions in examples do not count)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"`|\*\*|__|<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = _prose(path.read_text())
    found: set[str] = set(HTML_ANCHOR.findall(text))
    counts: dict[str, int] = {}
    for _, title in HEADING.findall(text):
        base = slug(title)
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def _links(path: Path) -> list[str]:
    text = INLINE_CODE.sub("", _prose(path.read_text()))
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading or <a id> {anchor!r} in {dest.name}")
    assert broken == [], f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


@cache
def _is_commit(rev: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=ROOT,
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_revisions_are_in_the_history(page: Path) -> None:
    cited = set(REVISION.findall(INLINE_CODE.sub("", _prose(page.read_text()))))
    missing = sorted(r for r in cited if not _is_commit(r))
    assert missing == [], f"{page.relative_to(ROOT)} cites revisions not in git: {missing}"


def test_the_revision_pattern_finds_revisions_and_nothing_else() -> None:
    text = "revision c477047 (with uncommitted changes), at 5dcb3e6; 10000000 rows, a uuid " \
           "4f83346e-1564-4e10-9dcb-ae4519ddc89a, docs/abc1234.md, decade"
    assert REVISION.findall(text) == ["c477047", "5dcb3e6"]


def test_code_points_at_pages_that_exist() -> None:
    """Docstrings, help texts and messages that name a docs page name one that exists."""
    roots = ["delayq_transport", "delayq_beat", "bench", "tests", "examples", "scripts"]
    mention = re.compile(r"\bdocs/[\w/.-]+\.md")
    missing = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*")):
            scanned = (".py", ".sh", ".sql", ".html", ".toml")
            if path.suffix not in scanned and path.parent.name != "scripts":
                continue
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path == Path(__file__):
                continue
            for ref in set(mention.findall(path.read_text(errors="replace"))):
                if not (ROOT / ref).exists():
                    missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert missing == [], "pointers to docs pages that do not exist:\n" + "\n".join(missing)
