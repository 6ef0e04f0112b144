"""bench_core.py's timing: time-boxed, interleaved measurement of two sides of one operation.

A rate is units over the seconds spent inside the measured calls only: inputs are prepared and
an exhausted table is refilled with the clock stopped (:class:`Workload`, :class:`Meter`). Both
sides run in short alternating slices (:func:`measure_interleaved`), so a busy second of a
shared machine lands on both and their ratio stays meaningful when the absolute rates do not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.progress import Progress, TaskID

#: How often a running measurement redraws its bar; redrawing per call would slow fast loops.
PROGRESS_REFRESH_S = 0.1


@dataclass
class Sample:
    """One time-boxed measurement: ``units`` processed in ``seconds`` of measured calls."""

    units: int
    seconds: float
    refills: int = 0

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Series:
    """Repeated samples of one workload; the median is the reported figure."""

    samples: list[Sample] = field(default_factory=list)

    @property
    def median_rate(self) -> float:
        return statistics.median(s.rate for s in self.samples) if self.samples else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "median_per_s": round(self.median_rate, 1),
            "samples": [dict(asdict(s), rate_per_s=round(s.rate, 1)) for s in self.samples],
        }


def paired_ratio(numerator: Series, denominator: Series) -> float:
    """Median of per-round ratios: samples at the same index ran interleaved, under one load."""
    ratios = [a.rate / b.rate for a, b in zip(numerator.samples, denominator.samples, strict=True)
              if b.rate > 0]
    return statistics.median(ratios) if ratios else 0.0


class Exhausted(Exception):
    """Raised by a step that ran out of input (an empty queue): refill, then go on."""


@dataclass
class Workload:
    """``step(prepare())`` processes some units and returns how many; only ``step`` is timed.

    ``prepare`` builds inputs (keys, message lists) with the clock stopped.
    """

    step: Callable[[Any], int]
    prepare: Callable[[], Any] = lambda: None


class Meter:
    """Accumulates units and seconds spent inside one workload's ``step`` across many slices.

    ``refill`` runs untimed whenever ``step`` raises :class:`Exhausted`; ``on_progress``
    receives (seconds, units) at most every ``PROGRESS_REFRESH_S``.
    """

    def __init__(
        self,
        work: Workload,
        *,
        refill: Callable[[], None] | None = None,
        on_progress: Callable[[float, int], None] | None = None,
    ) -> None:
        self.work, self.refill, self.on_progress = work, refill, on_progress
        self.spent, self.units, self.refills = 0.0, 0, 0
        self._next_report = 0.0

    def run_for(self, seconds: float) -> None:
        """Run whole steps until at least ``seconds`` more have been spent inside them."""
        until = self.spent + seconds
        while self.spent < until:
            arg = self.work.prepare()
            started = time.perf_counter()
            try:
                self.units += self.work.step(arg)
            except Exhausted:
                self.spent += time.perf_counter() - started
                if self.refill is None:
                    raise
                self.refill()
                self.refills += 1
                continue
            self.spent += time.perf_counter() - started
            if self.on_progress is not None and self.spent >= self._next_report:
                self.on_progress(self.spent, self.units)
                self._next_report = self.spent + PROGRESS_REFRESH_S
        if self.on_progress is not None:
            self.on_progress(self.spent, self.units)

    def sample(self) -> Sample:
        return Sample(units=self.units, seconds=self.spent, refills=self.refills)


def measure_interleaved(
    meters: dict[str, Meter], *, seconds: float, slice_seconds: float
) -> dict[str, Sample]:
    """Alternate the workloads in short slices until each has ``seconds`` of measured time.

    On a shared machine the background load changes from one second to the next; slicing
    makes every side see the same load, so their ratio stays meaningful even when the
    absolute rates do not. A slice is at least one whole step.
    """
    while any(m.spent < seconds for m in meters.values()):
        for meter in meters.values():
            if meter.spent < seconds:
                meter.run_for(min(slice_seconds, seconds - meter.spent))
    return {name: m.sample() for name, m in meters.items()}


def timed_task(progress: Progress, description: str, seconds: float) -> TaskID:
    """A task whose bar fills with measured seconds (a :class:`Meter`'s ``on_progress``)."""
    return progress.add_task(description, total=round(seconds, 1), rate="", unit="s")


def reporter(progress: Progress, task: TaskID, unit: str = "msgs") -> Callable[[float, int], None]:
    """An ``on_progress`` callback that moves ``task`` and shows the running rate."""

    def report(spent: float, units: int) -> None:
        rate = units / spent if spent > 0 else 0.0
        progress.update(task, completed=round(spent, 1), rate=f"{rate:>10,.0f} {unit}/s")

    return report
