"""The timeline chart as plain SVG geometry (rendered by the template: no JS chart library).

One bar per bucket of what falls due, an "overdue" bar on the left for rows already due and not
yet taken, hour labels along the bottom and a labelled top gridline, so the busy hours stand out
at a glance. Buckets too full to count are drawn with a hatch and labelled as estimates.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..browse import Timeline
from ..core.queue import from_ms

WIDTH, HEIGHT = 960, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 18, 34
OVERDUE_W = 44
GAP = 2


@dataclass
class Bar:
    x: float
    y: float
    w: float
    h: float
    count: int
    label: str
    estimated: bool
    href: str


@dataclass
class Chart:
    width: int
    height: int
    bars: list[Bar]
    overdue: Bar
    ticks: list[tuple[float, str, str]]  # x, UTC label, ISO time (app.js relabels it)
    grid: list[tuple[float, str]]
    baseline: float
    total: int
    any_estimated: bool


def _nice(n: int) -> int:
    for scale in (1, 10, 100, 1000, 10_000, 100_000, 1_000_000, 10_000_000):
        for step in (1, 2, 5):
            if step * scale >= n:
                return step * scale
    return n


def _fmt(n: int) -> str:
    return f"{n / 1_000_000:.1f}M" if n >= 1_000_000 else f"{n / 1000:.0f}k" if n >= 10_000 \
        else str(n)


def _iso(ms: int) -> str:
    return from_ms(ms).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(t: Timeline, queue: str | None = None) -> Chart:
    base = "/tasks?" + (f"queue={queue}&" if queue else "")
    top = _nice(max([*t.counts, t.overdue, 1]))
    plot_h = HEIGHT - TOP - BOTTOM
    baseline = TOP + plot_h
    x0 = LEFT + OVERDUE_W + 36
    step = (WIDTH - RIGHT - x0) / max(len(t.counts), 1)

    def height(n: int) -> float:
        return 0 if n <= 0 else max(plot_h * n / top, 2)

    bars = []
    for i, n in enumerate(t.counts):
        lo, hi = t.edges_ms[i], t.edges_ms[i + 1]
        h = height(n)
        when = f"{from_ms(lo):%a %H:%M}–{from_ms(hi):%H:%M} UTC"
        label = f"{'≈' if t.estimated[i] else ''}{n:,} due {when}"
        href = f"{base}eta_after={_iso(lo)}&eta_before={_iso(hi)}"
        bars.append(Bar(x0 + i * step + GAP / 2, baseline - h, max(step - GAP, 1), h, n, label,
                        t.estimated[i], href))
    od = height(t.overdue)
    overdue = Bar(LEFT, baseline - od, OVERDUE_W, od, t.overdue,
                  f"{t.overdue:,}{'+' if t.overdue_capped else ''} overdue (due, not taken yet)",
                  t.overdue_capped, f"{base}state=due")
    ticks = _ticks(t, x0, step)
    grid = [(baseline - plot_h * f, _fmt(round(top * f))) for f in (0.5, 1.0)]
    return Chart(WIDTH, HEIGHT, bars, overdue, ticks, grid, baseline, sum(t.counts),
                 any(t.estimated))


def _ticks(t: Timeline, x0: float, step: float) -> list[tuple[float, str, str]]:
    """About eight labels, on bucket edges; the date is shown where the day changes."""
    every = max(len(t.counts) // 8, 1)
    out: list[tuple[float, str, str]] = []
    last_day = None
    for i in range(0, len(t.counts) + 1, every):
        when: datetime = from_ms(t.edges_ms[i])
        label = f"{when:%H:%M}" if when.date() == last_day else f"{when:%b %d %H:%M}"
        last_day = when.date()
        out.append((x0 + i * step, label, _iso(t.edges_ms[i])))
    return out
