"""Prometheus's text exposition format: the bookie's and the autorecovery daemon's `/metrics` lines."""

from __future__ import annotations

from collections.abc import Iterator

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric(name: str, kind: str, help_text: str, value: float, labels: str = "") -> Iterator[str]:
    yield f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name}{labels} {number(value)}\n"


def number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
