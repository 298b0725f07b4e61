"""Stream a file through a resumable codec scan, one chunk at a time."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from bkctl import limits
from bkctl.errors import NotFoundError
from bkctl.protocol.scanning import ScanStop, StopStatus

Item = TypeVar("Item")
# (buffer, start in buffer, file offset of buffer[0], no bytes after the buffer) -> records, then a stop.
ScanFunction = Callable[[bytes, int, int, bool], Generator[Item, None, ScanStop]]


def open_read_only(path: Path) -> int:
    """A read-only file descriptor for `path`; NotFoundError (one line, exit 4) when it is missing, not
    a regular file, or cannot be opened. Every inspect command opens its files through here."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None
    except OSError as exc:
        raise NotFoundError(f"{path}: cannot open: {exc.strerror}") from None
    if stat.S_ISDIR(os.fstat(fd).st_mode):  # Linux opens a directory read-only; reading it fails later
        os.close(fd)
        raise NotFoundError(f"{path} is a directory, not a file")
    return fd


def read_at(path: Path, offset: int, size: int) -> bytes:
    """Up to `size` bytes of `path` from `offset` (a header, a small file)."""
    fd = open_read_only(path)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def directory_entries(path: Path) -> list[Path]:
    """The entries of a directory; NotFoundError (one line, exit 4) when it cannot be listed."""
    try:
        return list(path.iterdir())
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such directory") from None
    except NotADirectoryError:
        raise NotFoundError(f"{path} is not a directory") from None
    except OSError as exc:
        raise NotFoundError(f"{path}: cannot list: {exc.strerror}") from None


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None


class FileScan(Generic[Item]):
    """Iterate the records `scan` finds in `path` from `start`; afterwards `stop` says where it ended.

    Holds one chunk plus the unfinished record before it, so memory is bounded by the chunk size and
    the codec's record size limit. Yielded memoryviews are valid until the next record is requested.
    """

    def __init__(self, path: Path, start: int, scan: ScanFunction[Item], chunk_size: int = 0) -> None:
        self.path = path
        self.start = start
        self.scan = scan
        self.chunk_size = chunk_size or limits.FILE_READ_CHUNK
        self.stop: ScanStop | None = None

    def __iter__(self) -> Iterator[Item]:
        fd = open_read_only(self.path)
        try:
            self.stop = yield from self._scan(fd)
        finally:
            os.close(fd)

    def _scan(self, fd: int) -> Generator[Item, None, ScanStop]:
        size = os.fstat(fd).st_size
        base = self.start
        buf = b""
        while True:
            chunk = os.pread(fd, self.chunk_size, base + len(buf))
            buf += chunk
            at_eof = base + len(buf) >= size or not chunk
            stop = yield from self.scan(buf, 0, base, at_eof)
            if stop.status is not StopStatus.NEED_MORE or at_eof:
                return stop
            # Keep the unfinished record; everything before it has been yielded.
            buf = buf[stop.position - base :]
            base = stop.position
