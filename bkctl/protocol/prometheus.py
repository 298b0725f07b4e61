"""Prometheus's text exposition format: the bookie's and the autorecovery daemon's `/metrics` lines."""

from __future__ import annotations

import math
from collections.abc import Iterator

from bkctl.protocol.op_stats import QUANTILES, summary_lines

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def family(name: str, kind: str, help_text: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


def metric(name: str, kind: str, help_text: str, value: float, labels: str = "") -> Iterator[str]:
    """One metric with one value (`labels`: `{k="v"}` or empty)."""
    yield family(name, kind, help_text) + f"{name}{labels} {number(value)}\n"


def summary(
    name: str, help_text: str, count: int, sum_ms: float | None = None, failed: int | None = None
) -> Iterator[str]:
    """Java's OpStatsLogger series for what bkctl counts but does not time (op_stats.op_stat_lines for
    what it times): quantiles NaN (Java's value for a window without data), `_sum` NaN unless known
    (ms), failures 0 unless counted."""
    nan = [math.nan] * len(QUANTILES)
    failures = (nan, failed or 0, math.nan if failed else 0.0)
    successes = (nan, count, math.nan if sum_ms is None else sum_ms)
    yield from summary_lines(name, help_text, [failures, successes])


def number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
