"""Pure pieces of `delayq tasks` / `delayq web`: histogram estimates, the chart geometry, filter
parsing, cursors, the task-name pre-filter and the bind rules."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from delayq_transport.browse import TaskFilter, Timeline, decode_cursor, encode_cursor
from delayq_transport.browse.service import _literal_parts
from delayq_transport.core import InvalidInput
from delayq_transport.core.inspect.inspector import TableStats
from delayq_transport.web import chart
from delayq_transport.web.security import WebConfig, is_loopback


def test_histogram_estimate_is_linear_inside_equal_depth_buckets() -> None:
    stats = TableStats(1000, [0, 100, 200, 300, 400], 0, 0, 0, 0)  # 250 rows per bucket
    assert stats.estimate_between(0, 400) == 1000
    assert stats.estimate_between(0, 50) == 125
    assert stats.estimate_between(150, 250) == 250
    assert stats.estimate_between(500, 600) == 0
    assert TableStats(1000, [], 0, 0, 0, 0).estimate_between(0, 10) == 0


def test_chart_scales_bars_and_links_each_bucket() -> None:
    t = Timeline([0, 3_600_000, 7_200_000, 10_800_000], [10, 40, 0], [False, True, False], 5,
                 False, 500)
    c = chart.build(t)
    assert [b.count for b in c.bars] == [10, 40, 0]
    assert c.bars[1].h > c.bars[0].h > 0 and c.bars[2].h == 0
    assert c.bars[1].estimated and c.bars[1].label.startswith("≈40")
    assert "eta_after=1970-01-01T01:00:00Z" in c.bars[1].href
    assert c.overdue.count == 5 and c.overdue.href.endswith("state=due")
    assert c.grid[-1][1] == "50"  # a round top gridline above the tallest bar


def test_filter_parsing_and_index_bounds() -> None:
    f = TaskFilter.parse(state="in-flight", eta_after="2030-01-01T00:00:00")
    assert f.state == "in_flight" and f.eta_after == datetime(2030, 1, 1, tzinfo=UTC)
    lo, hi = TaskFilter.parse(state="due").bounds_ms(1000)
    assert lo is None and hi == 1001
    assert TaskFilter.parse(queue="mail").narrows is False
    assert TaskFilter.parse(text="x").needs_payload
    with pytest.raises(InvalidInput):
        TaskFilter.parse(queue="a\x00b")


def test_cursor_round_trip() -> None:
    assert decode_cursor(encode_cursor(1795412612074, 42)) == (1795412612074, 42)
    assert decode_cursor("") is None
    with pytest.raises(InvalidInput):
        decode_cursor("bm9wZQ")  # "nope"


def test_task_glob_literal_parts() -> None:
    assert _literal_parts("billing.*") == [b"billing."]
    assert _literal_parts("*.remind?x") == [b".remind", b"x"]
    assert _literal_parts("caf\u00e9*") == []  # escaped in JSON: no byte pre-filter
    assert _literal_parts(None) == []


def test_bind_rules() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert WebConfig().allowed_hosts() == ["127.0.0.1", "::1", "[::1]", "localhost"]
    assert WebConfig(host="0.0.0.0", token="12345678").validate().allowed_hosts() == ["*"]
