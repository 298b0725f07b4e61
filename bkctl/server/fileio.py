"""Small file helpers of the bookie's writers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)


def write_all(fd: int, buffers: Sequence[bytes | memoryview], offset: int) -> None:
    """pwritev `buffers` at `offset`, IOV_MAX at a time, finishing any short write."""
    for first in range(0, len(buffers), IOV_MAX):
        chunk = buffers[first : first + IOV_MAX]
        expected = sum(map(len, chunk))
        written = os.pwritev(fd, chunk, offset)
        if written < expected:
            rest = memoryview(b"".join(chunk))[written:]
            while rest:
                count = os.pwrite(fd, rest, offset + written)
                rest, written = rest[count:], written + count
        offset += expected


def fsync_directory(directory: Path) -> None:
    """Make a new file's name durable."""
    fd = os.open(directory, os.O_RDONLY | CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
