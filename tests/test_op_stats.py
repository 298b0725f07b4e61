"""protocol/op_stats.py: Java's OpStatsLogger series (DataSketchesOpStatsLogger, PrometheusTextFormat),
a bounded sketch within 1 % of the true quantiles, windows rotated as Java's provider rotates them."""

from __future__ import annotations

import math
import random
import re

from bkctl.protocol.op_stats import BUCKETS_MAX, GAMMA, QUANTILES, OpStat, Sketch, op_stat_lines
from bkctl.protocol.prometheus import summary


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_quantiles_within_one_percent_and_max_exact() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(0, 2) for _ in range(20_000)]
    sketch = Sketch()
    for value in values:
        sketch.add(value)
    ordered = sorted(values)
    for q, got in zip(QUANTILES, sketch.quantiles(), strict=True):
        want = ordered[round(q * (len(ordered) - 1))]
        assert abs(got - want) <= want * (GAMMA - 1), (q, got, want)
    assert sketch.quantiles()[-1] == max(values)


def test_sketch_stays_bounded_and_weights_count() -> None:
    sketch = Sketch()
    value = 1e-9
    while value < 1e12:  # every bucket from below MIN_VALUE to above MAX_VALUE
        sketch.add(value)
        value *= 1.005
    assert len(sketch.buckets) == BUCKETS_MAX < 1500  # whatever the number of values
    weighted = Sketch()
    weighted.add(0.0, 3)
    weighted.add(5.0, 1)
    assert weighted.count == 4
    assert weighted.quantiles((0.5, 1.0)) == [0.0, 5.0]
    assert Sketch().quantiles((0.5,))[0] != Sketch().quantiles((0.5,))[0]  # NaN when empty


def test_windows_rotate_as_javas_provider() -> None:
    clock = Clock()
    stat = OpStat(window_s=60, clock=clock)
    stat.observe(True, 2.0)
    stat.observe(False, 9.0)
    assert all(math.isnan(v) for v in stat.quantiles(True))  # the first window is not complete yet
    clock.now += 61
    assert stat.quantiles(True)[0] == stat.quantiles(True)[-1] == 2.0
    assert stat.quantiles(False)[-1] == 9.0
    stat.observe(True, 4.0)
    clock.now += 60
    assert stat.quantiles(True)[-1] == 4.0  # only the last complete window
    clock.now += 130
    assert all(math.isnan(v) for v in stat.quantiles(True))  # a window without events
    assert stat.counts == [1, 2] and stat.sums == [9.0, 6.0]  # since start


def test_text_format_is_javas() -> None:
    clock = Clock()
    stat = OpStat(clock=clock)
    for value in (1.0, 2.0, 3.0):
        stat.observe(True, value)
    clock.now += 60
    text = "".join(op_stat_lines("bookie_journal_JOURNAL_ADD_ENTRY", "Adds.", stat))
    lines = text.splitlines()
    assert lines[:2] == [
        "# HELP bookie_journal_JOURNAL_ADD_ENTRY Adds.",
        "# TYPE bookie_journal_JOURNAL_ADD_ENTRY summary",
    ]
    expected_labels = [
        *(f'{{success="false",quantile="{q}"}}' for q in QUANTILES),
        '_count{success="false"}',
        '_sum{success="false"}',
        *(f'{{success="true",quantile="{q}"}}' for q in QUANTILES),
        '_count{success="true"}',
        '_sum{success="true"}',
    ]
    assert [line.split(" ")[0] for line in lines[2:]] == [
        "bookie_journal_JOURNAL_ADD_ENTRY" + label for label in expected_labels
    ]
    assert 'bookie_journal_JOURNAL_ADD_ENTRY{success="false",quantile="0.5"} NaN' in lines
    assert 'bookie_journal_JOURNAL_ADD_ENTRY{success="true",quantile="1.0"} 3.0' in lines
    assert 'bookie_journal_JOURNAL_ADD_ENTRY_count{success="true"} 3' in lines
    assert 'bookie_journal_JOURNAL_ADD_ENTRY_sum{success="true"} 6.0' in lines
    assert all(re.fullmatch(r"\S+ (NaN|\d+(\.\d+)?)", line) for line in lines[2:])


def test_untimed_summary_has_the_same_series() -> None:
    timed = [line.split(" ")[0] for line in op_stat_lines("x", "h", OpStat())]
    untimed = [line.split(" ")[0] for line in summary("x", "h", 5, failed=1)]
    assert timed == untimed
    text = "".join(summary("x", "h", 5))
    assert 'x_count{success="true"} 5\n' in text and 'x_sum{success="true"} NaN\n' in text
    assert 'x_count{success="false"} 0\n' in text and 'x_sum{success="false"} 0.0\n' in text
