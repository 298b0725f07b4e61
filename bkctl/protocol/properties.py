"""The numbers of a Java `.properties` config key, checked against their range: one way to read a
number for every daemon whose keys share a bk_server.conf (the bookie's, autorecovery's). A config is
the operator's input, so a bad value is a UsageError, not a ProtocolError."""

from __future__ import annotations

from typing import TypeVar

from bkctl.errors import UsageError

N = TypeVar("N", int, float)


def int_key(key: str, value: str, low: int, high: int) -> int:
    return _in_range(key, _parsed(key, value, int, "an integer"), low, high)


def float_key(key: str, value: str, low: float, high: float) -> float:
    return _in_range(key, _parsed(key, value, float, "a number"), low, high)


def _parsed(key: str, value: str, kind: type[N], what: str) -> N:
    try:
        return kind(value.strip())
    except ValueError:
        raise UsageError(f"config key {key}: {value!r} is not {what}") from None


def _in_range(key: str, number: N, low: N, high: N) -> N:
    if not low <= number <= high:
        raise UsageError(f"config key {key}: {number} is not in {low}..{high}")
    return number


def bool_key(key: str, value: str) -> bool:
    """Java's boolean key: true/false (also yes/no, on/off, 1/0), anything else refused."""
    text = value.strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise UsageError(f"config key {key}: {value!r} is not true or false")
