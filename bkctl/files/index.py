"""Ledger index files on disk: header, streamed entry locations, holes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bkctl import limits
from bkctl.errors import NotFoundError
from bkctl.files.chunks import file_size, open_read_only, read_at
from bkctl.protocol import index_format as ixf
from bkctl.protocol.entrylog_format import split_location
from bkctl.protocol.index_format import IndexHeader


@dataclass(frozen=True)
class IndexFile:
    path: Path
    ledger_id: int | None  # from the `<hex>.idx` name
    size: int
    header: IndexHeader

    @property
    def slot_bytes(self) -> int:
        return max(0, self.size - ixf.HEADER_SIZE)


def open_index(path: Path) -> IndexFile:
    """Read and decode the header region (ProtocolError when it is corrupt)."""
    size = file_size(path)
    header = ixf.decode_header(read_at(path, 0, ixf.HEADER_SIZE))
    return IndexFile(path, ixf.parse_index_file_name(path.name), size, header)


def ledger_index_path(ledger_id: int, index_dir: Path) -> Path:
    """The index file of `ledger_id` in an index (ledger) dir, given with or without its `current/`."""
    current = index_dir / "current" if (index_dir / "current").is_dir() else index_dir
    if not current.is_dir():
        raise NotFoundError(f"{index_dir}: no such directory")
    return current / ixf.index_path(ledger_id)


def index_entries(index: IndexFile, chunk_size: int = 0) -> Iterator[tuple[int, int, int]]:
    """(entry id, entry log id, offset) of every present slot, in entry order, read chunk by chunk."""
    chunk_size = chunk_size or limits.FILE_READ_CHUNK
    chunk_size -= chunk_size % ixf.SLOT_SIZE
    fd = open_read_only(index.path)
    try:
        position = ixf.HEADER_SIZE
        while position < index.size:
            chunk = os.pread(fd, chunk_size, position)
            if not chunk:
                break
            first = (position - ixf.HEADER_SIZE) // ixf.SLOT_SIZE
            for entry_id, location in ixf.decode_slots(chunk, first):
                yield (entry_id, *split_location(location))
            position += len(chunk)
    finally:
        os.close(fd)


@dataclass
class HoleTracker:
    """Missing entries below the last present one, as inclusive (first, last) ranges."""

    holes: list[tuple[int, int]] = field(default_factory=list)
    last_entry_id: int | None = None
    present: int = 0

    def see(self, entry_id: int) -> None:
        expected = 0 if self.last_entry_id is None else self.last_entry_id + 1
        if entry_id > expected:
            self.holes.append((expected, entry_id - 1))
        self.last_entry_id = entry_id
        self.present += 1

    @property
    def missing(self) -> int:
        return sum(last - first + 1 for first, last in self.holes)
