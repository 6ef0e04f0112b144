"""Failures captured for the docs: what a test made happen, kept in docs/_captured/NAME.json.

A test that makes a failure happen for real (a ``delayq`` command, a ``celery worker``, a
``.delay()``) calls :func:`capture` with what it saw: the exception class as the caller
received it and its message, a command's exit status and stderr, a log line. The parts that
vary per run (times, pids, cluster ids, the test's database and role names, temporary paths)
are normalised first, so a capture only changes when the behaviour does.

In a normal run the capture is compared with the committed file and the test fails on any
difference. To take a changed behaviour into the docs, run the test with
``DELAYQ_DOCS_CAPTURE=write`` (it rewrites its file), then ``python docs/_gen/captured.py``
(it rewrites every page region that shows a capture); ``tests/unit/test_docs_captured.py``
checks the pages against the files.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CAPTURED = ROOT / "docs" / "_captured"
WRITE = os.environ.get("DELAYQ_DOCS_CAPTURE") == "write"

#: Per-run parts and what the page shows instead. Applied after the test's own replacements.
_VARYING: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"), "<time>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00"), "<time>"),
    (re.compile(r"cluster \d+, up since [^)]+"), "cluster <id>, up since <time>"),
    (re.compile(r"\bpid \d+"), "pid <pid>"),
    (re.compile(r"/tmp/[\w./-]+"), "<tmp>"),
    (re.compile(r"\bdelayq_t_[0-9a-f]{12}\b"), "app"),
    (re.compile(r"\bdelayq_tpl_\d+\b"), "app"),
]


def normalise(text: str, replace: dict[str, str] | None = None) -> str:
    """``text`` with the test's own names (``replace``: longest first) and every per-run part
    (times, pids, cluster ids, test databases, temporary paths) made stable."""
    for old, new in sorted((replace or {}).items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    text = re.sub(rf"\b{re.escape(socket.gethostname())}\b", "<host>", text)
    for pattern, new in _VARYING:
        text = pattern.sub(new, text)
    return text


def exception_name(exc: BaseException) -> str:
    """The class as a traceback prints it (``module.Class``; builtins bare)."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else \
        f"{cls.__module__}.{cls.__qualname__}"


def public_name(exc: BaseException) -> str | None:
    """``delayq_transport.X`` when the class is exported there (what ``except`` names)."""
    import delayq_transport

    cls = type(exc)
    return f"delayq_transport.{cls.__name__}" \
        if getattr(delayq_transport, cls.__name__, None) is cls else None


def capture(name: str, test: str, *, replace: dict[str, str] | None = None,
            exc: BaseException | None = None, raised: tuple[str, str] | None = None,
            command: str | None = None,
            exit_status: int | None = None, output: str | None = None,
            log: str | None = None, process: str | None = None) -> dict[str, Any]:
    """Record (``DELAYQ_DOCS_CAPTURE=write``) or check what ``test`` captured under ``name``.

    ``exc``: the exception the caller received (``raised``: its class and message as another
    process printed them, the last line of its traceback); ``command`` and ``output``: a
    command line and what it printed (stderr); ``exit_status``: the process's (``process``
    names one that is not a command line); ``log``: the log line the failure printed."""
    found: dict[str, Any] = {"test": test}
    if exc is not None:
        found["exception"] = exception_name(exc)
        found["message"] = normalise(str(exc), replace)
        found["caught_as"] = public_name(exc)
    if raised is not None:
        found["exception"], message = raised
        found["message"] = normalise(message, replace)
        found["caught_as"] = None
    if command is not None:
        found["command"] = normalise(command, replace)
    if output is not None:
        found["output"] = normalise(output.rstrip("\n"), replace)
    if log is not None:
        found["log"] = normalise(log.rstrip("\n"), replace)
    if process is not None:
        found["process"] = process
    if exit_status is not None:
        found["exit_status"] = exit_status
    path = CAPTURED / f"{name}.json"
    if WRITE:
        CAPTURED.mkdir(exist_ok=True)
        path.write_text(json.dumps(found, indent=2, ensure_ascii=False) + "\n")
        return found
    regenerate = (f"regenerate with: DELAYQ_DOCS_CAPTURE=write python3 -m pytest "
                  f"'{test}', then python3 docs/_gen/captured.py")
    assert path.exists(), f"no capture docs/_captured/{name}.json: {regenerate}"
    committed = json.loads(path.read_text())
    assert found == committed, (
        f"what the failure does now differs from docs/_captured/{name}.json, which the docs "
        f"show:\n  now:       {json.dumps(found, ensure_ascii=False)}\n"
        f"  committed: {json.dumps(committed, ensure_ascii=False)}\n{regenerate}")
    return found


def traceback_end(stderr: str) -> tuple[str, str]:
    """The exception class and message a traceback printed on ``stderr`` ends with."""
    last = stderr.strip().splitlines()[-1]
    name, _, message = last.partition(": ")
    return name, message


def last_line_with(text: str, needle: str) -> str:
    """The last line of ``text`` (a log) that contains ``needle``."""
    lines = [line for line in text.splitlines() if needle in line]
    assert lines, f"no line with {needle!r} in:\n{text[-3000:]}"
    return lines[-1]
