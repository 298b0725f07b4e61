"""Java `.properties` files (bk_server.conf and the client's conf): the one reader of them.

Pure text parsing plus a bounded file read; below the bookie and the metadata store, which both read
Java's keys (the store its `zkEnableSecurity`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from bkctl.errors import UsageError

CONFIG_FILE_SIZE_MAX: Final = 4 * 1024 * 1024  # local bound
# The file of Java's keys every command reads its security keys from (`bkctl --conf FILE`).
ENV_CONF: Final = "BKCTL_CONF"
_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """Java `.properties` text -> {key: value}: `key=value`, `key: value` or `key value`, `#`/`!`
    comments, backslash line continuations and escapes (`\\t`, `\\uXXXX`, `\\=`). Later keys win."""
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split_entry(line)
        result[key] = value
    return result


def _logical_lines(text: str) -> Iterator[str]:
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if not pending and (not line or line[0] in "#!"):
            continue
        # An odd number of trailing backslashes continues the line (an even number is escaped ones).
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending += line[:-1]
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def _split_entry(line: str) -> tuple[str, str]:
    index = 0
    while index < len(line) and line[index] not in "=: \t\f":
        index += 2 if line[index] == "\\" else 1
    key, rest = line[:index], line[index:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape(key), _unescape(rest)


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        code = text[index + 1]
        if code == "u" and _is_hex(text[index + 2 : index + 6]):
            out.append(chr(int(text[index + 2 : index + 6], 16)))
            index += 6
            continue
        out.append(_ESCAPES.get(code, code))
        index += 2
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 4 and all(c in "0123456789abcdefABCDEF" for c in text)


def properties_from_env() -> dict[str, str]:
    """The keys of the file BKCTL_CONF names (`bkctl --conf`), {} when none is named."""
    conf = os.environ.get(ENV_CONF, "").strip()
    return read_properties_file(Path(conf)) if conf else {}


def read_properties_file(path: Path) -> dict[str, str]:
    """Read a bk_server.conf; UsageError if it is missing, unreadable or implausibly large."""
    try:
        if path.stat().st_size > CONFIG_FILE_SIZE_MAX:
            raise UsageError(f"config file {path} is larger than {CONFIG_FILE_SIZE_MAX} bytes")
        return parse_properties(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read config file {path}: {exc}") from None
