"""Refusals before a bookie writes any file: what it cannot serve must stay as it is for the operator.

Replay, the first checkpoint and GC would otherwise act on a ledger whose index cannot be read as if
the ledger were absent: its journal records skipped, its entry log records collected. Every index
file's header is decoded here (one read per file) and its length checked; the slots themselves are
checked offline by `bkctl bookie check`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from bkctl.errors import CorruptDataError, ProtocolError
from bkctl.protocol import index_format as ixf
from bkctl.server.fileio import CLOEXEC

log = logging.getLogger("bkctl.bookie")


def index_files(index_dirs: Iterable[Path]) -> Iterator[tuple[int, Path]]:
    """(ledger id, path) of every index file under the index dirs' `current/`."""
    for directory in index_dirs:
        for path in sorted((directory / "current").glob("*/*/*" + ixf.INDEX_SUFFIX)):
            ledger_id = ixf.parse_index_file_name(path.name)
            if ledger_id is not None:
                yield ledger_id, path


def index_problem(path: Path) -> str | None:
    """Why an index file cannot be served (its header or its slot region does not decode), or None.
    An empty file is fine: a checkpoint died before its header, and replay rebuilds the ledger."""
    fd = os.open(path, os.O_RDONLY | CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        if size < ixf.HEADER_SIZE:
            return f"index file of {size} bytes is shorter than its {ixf.HEADER_SIZE}-byte header"
        try:
            ixf.decode_header(os.pread(fd, ixf.HEADER_SIZE, 0))
        except ProtocolError as exc:
            return f"corrupt index header: {exc}"
        if (size - ixf.HEADER_SIZE) % ixf.SLOT_SIZE:
            return f"index file of {size} bytes ends inside a slot"
        return None
    finally:
        os.close(fd)


def rebuild_hint(ledger_id: int, ledger_dirs: Iterable[Path], index_dirs: Iterable[Path] = ()) -> str:
    """What repairs a ledger's index, as a command to paste."""
    dirs = " ".join([*(f"--ledger-dir {d}" for d in ledger_dirs), *(f"--index-dir {d}" for d in index_dirs)])
    return f"repair it with `bkctl index rebuild {dirs} --ledger {ledger_id}`, then start again"


def check_index_files(index_dirs: tuple[Path, ...], ledger_dirs: tuple[Path, ...]) -> int:
    """The number of index files, all decodable; else CorruptDataError naming the first bad one."""
    count = 0
    for ledger_id, path in index_files(index_dirs):
        problem = index_problem(path)
        if problem is not None:
            raise CorruptDataError(
                f"{path}: ledger {ledger_id}: {problem}: refusing to start, nothing was changed; "
                + rebuild_hint(ledger_id, ledger_dirs, () if index_dirs == ledger_dirs else index_dirs)
            )
        count += 1
    return count
