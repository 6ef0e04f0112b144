"""The three tasks of apps/report.py as django.tasks tasks, and their sender."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import report
from django.tasks import task
from django.utils import timezone


@task
def noop(key: str, total: int) -> None:
    report.count(key, total)


@task
def timed(key: str, ident: int, due: float) -> None:
    report.timed(key, ident, due)


@task
def sleepy(key: str, ident: int, seconds: float) -> None:
    report.sleepy(key, ident, seconds)


TASKS = {"noop": noop, "timed": timed, "sleepy": sleepy}


class Sender:
    """``enqueue`` outside any transaction; a delay as ``run_after``."""

    def send(self, name: str, args: tuple[Any, ...], delay_s: float) -> None:
        t = TASKS[name]
        if delay_s:
            t = t.using(run_after=timezone.now() + timedelta(seconds=delay_s))
        t.enqueue(*args)

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


def produce_main() -> None:
    report.main(Sender)
