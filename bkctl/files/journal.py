"""Journal files on disk: find them, read the header, stream the records, summarize fast."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bkctl.errors import NotFoundError
from bkctl.files.chunks import FileScan, directory_entries, read_at
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import ScanItem


@dataclass(frozen=True)
class JournalFile:
    path: Path
    journal_id: int | None  # from the `<hex>.txn` name; None for another name
    version: int

    @property
    def data_start(self) -> int:
        return jf.data_start(self.version)


def open_journal(path: Path) -> JournalFile:
    """Read the header of one journal file (ProtocolError for an unsupported version)."""
    header = read_at(path, 0, 8)
    return JournalFile(path, jf.parse_journal_file_name(path.name), jf.decode_header(header))


def find_journals(path: Path) -> list[Path]:
    """`path` itself when it is a file, else the `*.txn` files of `path/current` (or `path`) by id."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise NotFoundError(f"{path}: no such file or directory")
    directory = path / "current" if (path / "current").is_dir() else path
    journals = [(jf.parse_journal_file_name(p.name), p) for p in directory_entries(directory) if p.is_file()]
    found = sorted((jid, p) for jid, p in journals if jid is not None)
    if not found:
        raise NotFoundError(f"{directory}: no journal files (*.txn)")
    return [p for _, p in found]


def journal_records(journal: JournalFile, chunk_size: int = 0) -> FileScan[ScanItem]:
    """The records of a journal from its first record; `.stop` afterwards says how the scan ended."""
    scan = partial(_scan, version=journal.version)
    return FileScan(journal.path, journal.data_start, scan, chunk_size)


def _scan(buf: bytes, start: int, base: int, at_eof: bool, *, version: int) -> Any:
    return jf.scan_records(buf, start, base, version, at_eof)
