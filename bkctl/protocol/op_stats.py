"""Java's OpStatsLogger as its Prometheus provider writes it (DataSketchesOpStatsLogger,
PrometheusTextFormat): one summary per operation with `success="false"` and `success="true"` series, each
the quantiles 0.5 ... 1.0 of the last complete window, `_count` and `_sum` since start (milliseconds for
latencies). Java rotates its sketches every `prometheusStatsLatencyRolloverSeconds` (60 s): a scrape shows
the previous window's quantiles, NaN when it saw no event.

The sketch is log-bucketed (DDSketch's idea): a value v counts in bucket ceil(log(v) / log(GAMMA)), so a
quantile is within 1 % of a value actually seen, one observation costs a logarithm and a dict update, and
a window holds at most a few thousand buckets however many events it sees (values are clamped to
[MIN_VALUE, MAX_VALUE]). Rotation is lazy: the clock is read on each observation and scrape, no timer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Final

QUANTILES: Final = (0.5, 0.75, 0.95, 0.99, 0.999, 0.9999, 1.0)
ROLLOVER_S: Final = 60.0  # format fact: Java's prometheusStatsLatencyRolloverSeconds default
GAMMA: Final = 1.02  # bucket bounds grow by 2 %: a quantile is within 1 % of a seen value
MIN_VALUE: Final = 1e-3  # 1 microsecond in ms: smaller values (and 0) share one bucket, standing for 0
MAX_VALUE: Final = 1e9  # about 11 days in ms: larger values are counted as this
_LOG_GAMMA: Final = math.log(GAMMA)
_ZERO: Final = math.ceil(math.log(MIN_VALUE) / _LOG_GAMMA) - 1  # the bucket below MIN_VALUE
# local bound: the most buckets a sketch can hold (about 1400: one per 2 % from MIN_VALUE to MAX_VALUE)
BUCKETS_MAX: Final = math.ceil(math.log(MAX_VALUE) / _LOG_GAMMA) - _ZERO + 1


class Sketch:
    """Counts of values by logarithmic bucket, and the exact largest value."""

    __slots__ = ("buckets", "count", "largest")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.largest = math.nan

    def add(self, value: float, weight: int = 1) -> None:
        value = min(value, MAX_VALUE)
        index = math.ceil(math.log(value) / _LOG_GAMMA) if value >= MIN_VALUE else _ZERO
        self.buckets[index] = self.buckets.get(index, 0) + weight
        self.count += weight
        if not value <= self.largest:  # NaN at first
            self.largest = value

    def quantiles(self, wanted: tuple[float, ...] = QUANTILES) -> list[float]:
        """The values at `wanted` (ascending), NaN for each when the sketch is empty; 1.0 is the largest."""
        if not self.count:
            return [math.nan] * len(wanted)
        ranks = [q * (self.count - 1) for q in wanted]
        answers: list[float] = []
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            while len(answers) < len(ranks) and ranks[len(answers)] < seen:
                answers.append(_bucket_value(index))
        answers += [self.largest] * (len(ranks) - len(answers))
        return [
            self.largest if q >= 1.0 else min(a, self.largest) for q, a in zip(wanted, answers, strict=True)
        ]


def _bucket_value(index: int) -> float:
    """The value a bucket stands for: halfway (relatively) between its bounds."""
    if index == _ZERO:
        return 0.0
    return 2 * GAMMA**index / (GAMMA + 1)


class OpStat:
    """One operation's counts and sums since start (success and failure) and the quantiles of the last
    complete window of `window_s` seconds."""

    __slots__ = ("_clock", "_current", "_published", "_quantiles", "_started", "counts", "sums", "window_s")

    def __init__(self, window_s: float = ROLLOVER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._started = clock()
        self._current = (Sketch(), Sketch())  # (failed, succeeded), as `success` False, True
        self._published = (Sketch(), Sketch())
        self._quantiles: list[list[float] | None] = [None, None]  # of _published, computed once a window
        self.counts = [0, 0]
        self.sums = [0.0, 0.0]

    def observe(self, success: bool, value: float, weight: int = 1) -> None:
        """`weight` events of `value` (ms for a latency, a count or size for a value stat)."""
        if self._clock() - self._started >= self.window_s:
            self._roll()
        self._current[success].add(value, weight)
        self.counts[success] += weight
        self.sums[success] += value * weight

    def quantiles(self, success: bool) -> list[float]:
        if self._clock() - self._started >= self.window_s:
            self._roll()
        cached = self._quantiles[success]
        if cached is None:
            cached = self._quantiles[success] = self._published[success].quantiles()
        return cached

    def _roll(self) -> None:
        windows = int((self._clock() - self._started) // self.window_s)
        # The window that just ended is published; if more than one ended, the last one saw nothing.
        self._published = self._current if windows == 1 else (Sketch(), Sketch())
        self._current = (Sketch(), Sketch())
        self._quantiles = [None, None]
        self._started += windows * self.window_s


def op_stat_lines(name: str, help_text: str, stat: OpStat) -> Iterator[str]:
    """The summary `name` as Java's PrometheusTextFormat.writeOpStat writes it."""
    series = [(stat.quantiles(flag), stat.counts[flag], stat.sums[flag]) for flag in (False, True)]
    yield from summary_lines(name, help_text, series)


def summary_lines(name: str, help_text: str, series: list[tuple[list[float], int, float]]) -> Iterator[str]:
    """Java's summary lines from (quantiles, count, sum) of the failed, then the successful events."""
    yield f"# HELP {name} {help_text}\n# TYPE {name} summary\n"
    for flag, (quantiles, count, total) in zip(("false", "true"), series, strict=True):
        for q, value in zip(QUANTILES, quantiles, strict=True):
            yield f'{name}{{success="{flag}",quantile="{q}"}} {_double(value)}\n'
        yield f'{name}_count{{success="{flag}"}} {count}\n'
        yield f'{name}_sum{{success="{flag}"}} {_double(total)}\n'


def _double(value: float) -> str:
    """Java's Double.toString for what a summary holds: NaN, 1.0, 0.25, 12.345."""
    if math.isnan(value):
        return "NaN"
    return repr(round(float(value), 6))
