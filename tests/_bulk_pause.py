"""Holding a bulk job between its batches, so a test sees its progress (web and browser tests)."""

from __future__ import annotations

import threading
from typing import Any

import pytest


def pause_before_the_second_batch(monkeypatch: pytest.MonkeyPatch, inspector: Any
                                  ) -> tuple[threading.Event, threading.Event]:
    """``(paused, release)``: the job's second batch waits, ``paused`` set, until the test sets
    ``release`` (bounded: 30 s, then the job fails the test)."""
    real, paused, release = inspector.cancel_unchanged, threading.Event(), threading.Event()
    calls: list[object] = []

    def wait_before_the_second_batch(*args: object) -> list[int]:
        calls.append(args)
        if len(calls) == 2:
            paused.set()
            assert release.wait(30), "the test never released the job"
        return real(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(inspector, "cancel_unchanged", wait_before_the_second_batch)
    return paused, release
