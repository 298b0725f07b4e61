"""Rebuild ledgers' index files from their records in the entry logs (Java's
regenerate-interleaved-storage-index-file), on a stopped bookie's directories.

Every entry log of the ledger dirs is scanned once for the wanted ledgers; a record whose digest does
not verify is left out, and an entry found in two logs (a compaction copy beside its not yet removed
original) takes the newer log's copy. The new index holds the master key the caller gives (from the
ledger's password), the fenced bit and explicit LAC of the old index where its header still decodes,
else fenced when the metadata says the ledger is closed. It is written beside the old file, synced,
then renamed over it (fileio.write_durably): a crash leaves the old index or the new one. The journal
is not touched: the next start replays its tail onto the rebuilt index.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bkctl.errors import ProtocolError
from bkctl.files.digests import DigestChecker
from bkctl.files.entrylog import entry_log_records, open_entry_log
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.server.entrylog import existing_log_ids
from bkctl.server.fileio import CLOEXEC, write_durably
from bkctl.server.start_checks import index_problem


@dataclass
class Rebuild:
    """What the rebuild of one ledger's index found, and will write or wrote."""

    ledger_id: int
    path: Path  # the index file (existing, or where a new one goes)
    old: str  # "missing", "readable" or why it is not
    locations: dict[int, int] = field(default_factory=dict)  # entry id -> entry log location
    rejected: int = 0  # records of the ledger whose digest did not verify
    fenced: bool = False
    fenced_from: str = "not fenced"
    explicit_lac: bytes | None = None
    master_key: bytes = b""
    key_from: str = ""

    def as_dict(self) -> dict[str, object]:
        entries = sorted(self.locations)
        return {
            "ledger_id": self.ledger_id,
            "index": str(self.path),
            "old_index": self.old,
            "entries": len(entries),
            "first_entry": entries[0] if entries else None,
            "last_entry": entries[-1] if entries else None,
            "rejected": self.rejected,
            "fenced": self.fenced,
            "fenced_from": self.fenced_from,
            "key_from": self.key_from,
        }


def index_path_for(ledger_id: int, index_dirs: tuple[Path, ...]) -> Path:
    """The existing index file, else where the bookie would create it (index dir id mod their count)."""
    relative = ixf.index_path(ledger_id)
    for directory in index_dirs:
        if (directory / "current" / relative).exists():
            return directory / "current" / relative
    return index_dirs[ledger_id % len(index_dirs)] / "current" / relative


def plan(
    ledger_ids: Iterable[int], ledger_dirs: tuple[Path, ...], index_dirs: tuple[Path, ...]
) -> list[Rebuild]:
    """Each ledger's rebuild: its records in the entry logs and what its old index still tells."""
    rebuilds = {i: _old_state(i, index_path_for(i, index_dirs)) for i in ledger_ids}
    checker = DigestChecker()
    for record in data_records(existing_log_ids(ledger_dirs)):
        rebuild = rebuilds.get(record.ledger_id)
        if rebuild is None:
            continue
        if checker.check(record.ledger_id, record.body)[1] is False:
            rebuild.rejected += 1
            continue
        rebuild.locations[record.entry_id] = record.location  # later logs win
    return [rebuilds[i] for i in sorted(rebuilds)]


@dataclass(frozen=True)
class DataRecord:
    log_path: Path
    offset: int  # of the record's size prefix
    location: int  # what an index slot holds for it: log id << 32 | offset after the size prefix
    ledger_id: int
    entry_id: int
    body: memoryview  # valid until the next record is read


def data_records(logs: dict[int, Path]) -> Iterator[DataRecord]:
    """Every stored entry of the entry logs, oldest log first."""
    for log_id, path in sorted(logs.items()):
        log = open_entry_log(path)
        if log.empty:
            continue
        for offset, kind, body in entry_log_records(log):
            if kind is ef.RecordKind.DATA:
                ledger_id, entry_id = ef.record_key(body)
                yield DataRecord(path, offset, (log_id << 32) | (offset + 4), ledger_id, entry_id, body)


def _old_state(ledger_id: int, path: Path) -> Rebuild:
    if not path.exists():
        return Rebuild(ledger_id, path, "missing")
    problem = index_problem(path)
    if problem is not None:
        return Rebuild(ledger_id, path, problem)
    fd = os.open(path, os.O_RDONLY | CLOEXEC)
    try:
        data = os.pread(fd, ixf.HEADER_SIZE, 0)
    finally:
        os.close(fd)
    if not data:
        return Rebuild(ledger_id, path, "empty")
    try:
        header = ixf.decode_header(data)
    except ProtocolError as exc:  # changed since index_problem read it
        return Rebuild(ledger_id, path, str(exc))
    rebuild = Rebuild(ledger_id, path, "readable", fenced=header.fenced, explicit_lac=header.explicit_lac)
    rebuild.fenced_from = "old index"
    rebuild.master_key, rebuild.key_from = header.master_key, "old index"
    return rebuild


def write(rebuild: Rebuild) -> None:
    """Write the new index durably over the old one (kept until the new one is synced)."""
    header = ixf.IndexHeader(
        ixf.V1, rebuild.master_key, ixf.STATE_FENCED if rebuild.fenced else 0, rebuild.explicit_lac
    )
    rebuild.path.parent.mkdir(parents=True, exist_ok=True)
    write_durably(rebuild.path, ixf.encode_header(header) + ixf.encode_slots(rebuild.locations))
