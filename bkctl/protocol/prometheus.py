"""Prometheus's text exposition format: the bookie's and the autorecovery daemon's `/metrics` lines."""

from __future__ import annotations

from collections.abc import Iterator

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
    """Java's OpStatsLogger: `_count{success="true"}` (and `_sum` in ms when bkctl times it)."""
    yield family(name, "summary", help_text)
    yield f'{name}_count{{success="true"}} {count}\n'
    if sum_ms is not None:
        yield f'{name}_sum{{success="true"}} {number(sum_ms)}\n'
    if failed is not None:
        yield f'{name}_count{{success="false"}} {failed}\n'


def number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
