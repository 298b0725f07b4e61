"""`lastMark` files: where journal replay starts, one per ledger dir (`lastMark.<i>` per journal)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bkctl.errors import NotFoundError
from bkctl.files.chunks import directory_entries, read_at
from bkctl.protocol import journal_format as jf

LAST_MARK_NAME = "lastMark"


@dataclass(frozen=True)
class LastMark:
    path: Path
    journal_id: int
    offset: int

    @property
    def journal_file(self) -> str:
        return jf.journal_file_name(self.journal_id)


def find_last_marks(path: Path) -> list[Path]:
    """Every `lastMark` and `lastMark.<n>` in `path`, `path/current`, or `path/*/current` (a bookie root)."""
    if path.is_file():
        if _is_last_mark(path):
            return [path]
        raise NotFoundError(
            f"{path} is not a directory (give a ledger dir, a bookie root or a lastMark file)"
        )
    if not path.is_dir():
        raise NotFoundError(f"{path}: no such file or directory")
    subdirs = sorted(p / "current" for p in directory_entries(path) if p.is_dir())
    found = []
    for directory in [path, path / "current", *subdirs]:
        if directory.is_dir():
            found += sorted(p for p in directory_entries(directory) if _is_last_mark(p))
    return list(dict.fromkeys(found))


def _is_last_mark(path: Path) -> bool:
    name = path.name
    suffix = name.removeprefix(LAST_MARK_NAME)
    return (
        path.is_file()
        and name.startswith(LAST_MARK_NAME)
        and (not suffix or (suffix[1:].isdigit() and suffix[0] == "."))
    )


def read_last_mark(path: Path) -> LastMark:
    """Decode one lastMark file (ProtocolError unless it is exactly 16 bytes)."""
    journal_id, offset = jf.decode_last_mark(read_at(path, 0, jf.LAST_MARK_SIZE + 1))
    return LastMark(path, journal_id, offset)
